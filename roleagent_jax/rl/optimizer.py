"""The optimizer and the state it updates: AdamW after global-norm clipping, its learning-rate schedule,
and `TrainState` (params, optimizer state, step, key) placed on the mesh, optimizer moments sharded as
their params.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from roleagent_jax.parallel import sharding as shd

SCHEDULES = ("constant", "cosine")


@flax.struct.dataclass
class TrainState:
    """Everything the update changes. ``rng`` is carried for the caller (the step consumes none)."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array

    @classmethod
    def create(
        cls, params: Any, optimizer: optax.GradientTransformation, rng: jax.Array, mesh: Mesh | None = None
    ) -> TrainState:
        """A fresh state. Params are copied (onto ``mesh``'s param shardings when given, else where they
        are), so the caller's arrays (e.g. kept as the KL reference) survive the step's donation."""
        if mesh is not None:
            param_sh = shd.param_shardings(params, mesh)
        else:
            param_sh = jax.tree.map(lambda x: x.sharding, params)
        params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=param_sh)(params)
        abstract = jax.eval_shape(optimizer.init, params)
        opt_sh = mirror_param_shardings(abstract, params, param_sh, _replicated_like(param_sh))
        opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
        rep = _replicated_like(param_sh)
        step = jax.device_put(jnp.zeros((), jnp.int32), rep)
        return cls(params=params, opt_state=opt_state, step=step, rng=jax.device_put(rng, rep))


def _replicated_like(shardings: Any) -> jax.sharding.Sharding:
    leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    first = leaves[0] if leaves else None
    if isinstance(first, NamedSharding):
        return NamedSharding(first.mesh, P())
    if first is not None and len(first.device_set) == 1:
        return first
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _path_key(path: tuple) -> tuple[str, ...]:
    return tuple(str(k) for k in path)


def mirror_param_shardings(tree: Any, params: Any, param_sh: Any, default: Any) -> Any:
    """Shardings for an optimizer-state-like tree: a leaf whose path ends with a parameter's path and has
    its shape (Adam moments) takes that parameter's sharding; everything else (counts, scalars) gets
    ``default``."""
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], Any]] = {}
    for (path, leaf), sh in zip(
        jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(param_sh, is_leaf=_is_sharding)
    ):
        by_path[_path_key(path)] = (tuple(leaf.shape), sh)

    def pick(path, leaf):
        key = _path_key(path)
        for start in range(len(key)):
            hit = by_path.get(key[start:])
            if hit is not None and hit[0] == tuple(leaf.shape):
                return hit[1]
        return default

    return jax.tree_util.tree_map_with_path(pick, tree)


def _is_sharding(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding)


def make_optimizer(
    lr: float,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    warmup_steps: int = 0,
    schedule: str = "constant",
    total_steps: int | None = None,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    end_lr_ratio: float = 0.0,
) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (decoupled decay on every weight, as torch's AdamW in the reference).

    Keep ``param_dtype`` float32 for RL (float32 master weights, bfloat16 compute through the model's
    ``dtype``): an update of lr 1e-6 is below half an ulp of most bfloat16 weights and would be lost.

    ``schedule``: ``constant`` (after an optional linear warm-up from 0) or ``cosine`` (warm-up, then cosine
    decay to ``end_lr_ratio * lr`` at ``total_steps`` optimizer steps). The learning rate is an injected
    hyper-parameter so the train step can report it.
    """
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if schedule == "cosine":
        if not total_steps or total_steps <= warmup_steps:
            raise ValueError(
                "schedule='cosine' needs total_steps (optimizer steps) greater than warmup_steps"
            )
        sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps, total_steps, lr * end_lr_ratio)
    elif warmup_steps:
        sched = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup_steps), optax.constant_schedule(lr)], [warmup_steps]
        )
    else:
        sched = optax.constant_schedule(lr)
    # Hyper-parameters in float32 whatever the param dtype: b2 = 0.999 rounds to 1.0 in bfloat16, which
    # zeroes Adam's bias correction and turns the first update into NaN.
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mu_dtype",), hyperparam_dtype=jnp.float32)(
        learning_rate=sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mu_dtype=jnp.float32
    )
    clip = optax.clip_by_global_norm(grad_clip) if grad_clip and grad_clip > 0 else optax.identity()
    return optax.chain(clip, adamw)


def current_lr(opt_state: Any) -> jax.Array | None:
    found = []

    def visit(x):
        if hasattr(x, "hyperparams") and isinstance(x.hyperparams, Mapping):
            if "learning_rate" in x.hyperparams:
                found.append(x.hyperparams["learning_rate"])
            return True
        return False

    jax.tree_util.tree_leaves(opt_state, is_leaf=visit)
    return jnp.asarray(found[0], jnp.float32) if found else None
