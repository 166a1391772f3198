"""The policy update: packed token grid, token log-probs from the model, one jitted optimizer step.

Token grid (``pack_rows``): each row is ``[left pad | prompt | response | right pad]``, all rows share
the prompt/response boundary. Alignment: ``logprobs[:, t]`` is the log-probability of token ``t``
given tokens ``< t``, i.e. it comes from the logits at ``t - 1``; column 0 has no predictor and is 0.
``loss_mask`` is 1 exactly on response tokens, so old/ref/new log-probs, per-token advantages and the
mask all index the same grid. ``target_index`` ``[B, K]`` lists each row's response columns (K a
bucketed width, padding 0): with it the LM head (logits, log-sum-exp, entropy over the vocabulary) runs
on the hidden states of those K positions only, the ~30 response tokens of a ~250-token row, and the
results are scattered back onto the grid (0 elsewhere). Without it every column is scored.

The step is a pure function ``(state, batch) -> (state, metrics)`` jitted with explicit shardings
(params by ``sharding.param_shardings``, optimizer moments mirroring their params, batch rows over
``(data, fsdp)``) and the state donated. It runs as two programs, the gradients (forward and backward)
and the optimizer update, so that each phase's time can be reported. Micro-batches run in a ``lax.scan`` that sums loss
numerators, denominators and gradients, dividing once at the end, so the update equals the
full-batch one.

With LoRA the state's params are the adapters only and the base comes in as ``frozen``: an input
the step reads but neither differentiates nor donates, so it carries no gradient and no optimizer state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from roleagent_jax import sharding as shd
from roleagent_jax.losses import LossConfig, loss_from_config, reduce_metrics

log = logging.getLogger(__name__)

MODEL_KEYS = ("input_ids", "attention_mask", "positions")
TARGET_KEY = "target_index"
TARGET_BUCKET = 16  # target widths are rounded up to a multiple of this: few compiled shapes
SCHEDULES = ("constant", "cosine")
_DROPOUT_STREAM = 0x10A  # folded into the state's key: adapter dropout draws its own random stream


# --------------------------------------------------------------------------------------------------
# state and optimizer


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
        opt_sh = _mirror_param_shardings(abstract, params, param_sh, _replicated_like(param_sh))
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


def _mirror_param_shardings(tree: Any, params: Any, param_sh: Any, default: Any) -> Any:
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


def _current_lr(opt_state: Any) -> jax.Array | None:
    found = []

    def visit(x):
        if hasattr(x, "hyperparams") and isinstance(x.hyperparams, Mapping):
            if "learning_rate" in x.hyperparams:
                found.append(x.hyperparams["learning_rate"])
            return True
        return False

    jax.tree_util.tree_leaves(opt_state, is_leaf=visit)
    return jnp.asarray(found[0], jnp.float32) if found else None


# --------------------------------------------------------------------------------------------------
# log-probs


def _logprob_entropy(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-prob of ``targets`` and entropy of each float32 logit row ``[..., V]``. The token's logit is
    picked by a masked reduction over the vocabulary (partitions cleanly when the vocab dim is
    sharded, unlike a gather)."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    picked = jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)
    probs = jnp.exp(logits - logz[..., None])
    return picked - logz, logz - jnp.sum(probs * logits, axis=-1)


def token_logprobs(logits: jax.Array, input_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Shifted token log-probs and entropies on the token grid, in float32.

    ``out[:, t]`` scores token ``t`` with the distribution predicted at ``t - 1``; column 0 is 0.
    """
    logp, entropy = _logprob_entropy(logits[:, :-1].astype(jnp.float32), input_ids[:, 1:])
    pad = jnp.zeros((logits.shape[0], 1), jnp.float32)
    return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, entropy], 1)


def target_logprobs(
    head: Callable[[jax.Array], jax.Array], hidden: jax.Array, input_ids: jax.Array, index: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``token_logprobs`` at the columns ``index`` ``[B, K]`` only (0 = padding), on the ``[B, T]`` grid.

    Only the K hidden states that predict those tokens (column ``t - 1`` for token ``t``) go through
    ``head``: the vocabulary-wide work, forward and backward, shrinks from T to K positions per row.
    """
    b, t = input_ids.shape
    index = index.astype(jnp.int32)
    valid = index > 0
    source = jnp.take_along_axis(hidden, jnp.maximum(index - 1, 0)[..., None], axis=1)
    logits = head(source).astype(jnp.float32)
    logp, entropy = _logprob_entropy(logits, jnp.take_along_axis(input_ids, index, axis=1))
    rows = jnp.arange(b)[:, None]

    def on_grid(x: jax.Array) -> jax.Array:  # padding adds 0 to column 0, which scores nothing
        return jnp.zeros((b, t), jnp.float32).at[rows, index].add(jnp.where(valid, x, 0.0))

    return on_grid(logp), on_grid(entropy)


def target_index(loss_mask: np.ndarray, bucket: int = TARGET_BUCKET) -> np.ndarray:
    """``[N, K]`` int32: each row's loss-carrying columns, in order, padded with 0 (column 0 never
    carries a target); K is the most any row has rounded up to ``bucket``, at most the grid width."""
    mask = np.asarray(loss_mask) > 0
    if mask[:, 0].any():
        raise ValueError("column 0 has no predicting position and cannot carry a target")
    width = min(mask.shape[1], max(_round_up(int(mask.sum(1).max(initial=0)), bucket), bucket))
    out = np.zeros((mask.shape[0], width), np.int32)
    for i, row in enumerate(mask):
        cols = np.flatnonzero(row)
        out[i, : cols.size] = cols
    return out


def _model_logprobs(graphdef, params, batch, remat: bool, frozen=None, dropout_key=None):
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    if remat and hasattr(model, "config") and not getattr(model.config, "remat", True):
        # Per-layer rematerialisation as implemented by the model (only the block inputs are kept).
        model.config = dataclasses.replace(model.config, remat=True)
    ids = batch["input_ids"]
    hidden = model.hidden(ids, batch["attention_mask"], batch["positions"], dropout_key=dropout_key)
    if TARGET_KEY in batch:
        return target_logprobs(model.head, hidden, ids, batch[TARGET_KEY])
    return token_logprobs(model.head(hidden), ids)


def _model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """What the model reads: the grid, and the target columns when the batch has them."""
    return {k: batch[k] for k in (*MODEL_KEYS, TARGET_KEY) if k in batch}


def _split_micro(x: jax.Array, micro: int) -> jax.Array:
    """[B, ...] -> [micro, B / micro, ...], micro-batch i = rows i, i + micro, ... so every device's row
    block contributes to every micro-batch (no resharding between scan iterations)."""
    b = x.shape[0]
    return jnp.swapaxes(x.reshape(b // micro, micro, *x.shape[1:]), 0, 1)


def _merge_micro(x: jax.Array) -> jax.Array:
    m, r = x.shape[:2]
    return jnp.swapaxes(x, 0, 1).reshape(m * r, *x.shape[2:])


def _check_rows(batch: Mapping[str, Any], micro: int) -> int:
    rows = batch["input_ids"].shape[0]
    if micro < 1 or rows % micro:
        raise ValueError(f"batch has {rows} rows, not divisible by micro_batches={micro}: pad the batch")
    return rows


def _batch_shardings(mesh: Mesh, batch: Mapping[str, Any]) -> dict[str, NamedSharding]:
    return {k: shd.batch_sharding(mesh, np.ndim(v)) for k, v in batch.items()}


def _micro_constraint(mesh: Mesh | None, tree: Any) -> Any:
    if mesh is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(
            x, NamedSharding(mesh, P(None, shd.BATCH_AXES, *([None] * (x.ndim - 2))))
        ),
        tree,
    )


class LogprobFn:
    """``(params, batch, frozen=None) -> logprobs [B, T]`` (float32, 0 at column 0 and on padding; with
    ``target_index`` in the batch, only those columns are scored, 0 elsewhere); see module doc.
    ``frozen``: the LoRA base, when ``params`` are adapters."""

    def __init__(self, graphdef, mesh: Mesh | None = None, micro_batches: int = 1):
        self.graphdef, self.mesh, self.micro = graphdef, mesh, micro_batches
        self._jitted: dict[Any, Any] = {}

    def _build(self, params, batch, frozen):
        graphdef, mesh, micro = self.graphdef, self.mesh, self.micro

        def fn(params, batch, frozen):
            _check_rows(batch, micro)
            mask = batch["attention_mask"] > 0
            if micro == 1:
                lp, _ = _model_logprobs(graphdef, params, batch, False, frozen)
            else:
                mbs = _micro_constraint(mesh, jax.tree.map(lambda x: _split_micro(x, micro), batch))
                lp = _merge_micro(
                    jax.lax.map(lambda mb: _model_logprobs(graphdef, params, mb, False, frozen)[0], mbs)
                )
            return jnp.where(mask, lp, 0.0)

        if mesh is None:
            return jax.jit(fn)
        in_sh = (
            shd.param_shardings(params, mesh),
            _batch_shardings(mesh, batch),
            shd.param_shardings(frozen, mesh) if frozen is not None else None,
        )
        return jax.jit(fn, in_shardings=in_sh, out_shardings=shd.batch_sharding(mesh, 2))

    def __call__(self, params, batch: Mapping[str, Any], frozen=None) -> jax.Array:
        inputs = _model_inputs(batch)
        key = (jax.tree_util.tree_structure((params, frozen)), tuple(inputs))
        if key not in self._jitted:
            self._jitted[key] = self._build(params, inputs, frozen)
        fn = self._jitted[key]
        if self.mesh is not None:
            inputs = jax.device_put(inputs, _batch_shardings(self.mesh, inputs))
        return fn(params, inputs, frozen)


def make_logprob_fn(graphdef, mesh: Mesh | None = None, micro_batches: int = 1) -> LogprobFn:
    """Jitted token log-probs of the ``pack_rows`` grid, e.g. the old-policy and reference log-probs
    computed once per batch before the update (at its ``target_index`` columns when it has them;
    other batch keys are ignored)."""
    return LogprobFn(graphdef, mesh, micro_batches)


# --------------------------------------------------------------------------------------------------
# train step


class TrainStep:
    """Callable ``(state, batch, frozen=None) -> (state, metrics)``: places inputs on their shardings,
    then runs the jitted gradient program and the jitted optimizer program (each compiled once per
    state structure and batch layout; jit caches shapes). ``frozen`` is the LoRA base when the state's
    params are adapters. ``times`` holds the last call's seconds per phase (``forward_backward``,
    ``optimizer``), each measured to its results being ready."""

    def __init__(
        self,
        graphdef,
        optimizer: optax.GradientTransformation,
        loss_cfg: LossConfig,
        mesh: Mesh | None,
        micro_batches: int,
        remat: bool,
    ):
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        self.graphdef, self.optimizer, self.loss_cfg = graphdef, optimizer, loss_cfg
        self.mesh, self.micro, self.remat = mesh, micro_batches, remat
        self._jitted: dict[Any, Any] = {}
        self.times: dict[str, float] = {}

    def batch_keys(self) -> tuple[str, ...]:
        keys = (*MODEL_KEYS, "loss_mask", "advantages", "old_logprobs")
        return (*keys, "ref_logprobs") if self.loss_cfg.kl_type != "none" else keys

    def _inputs(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        keys = self.batch_keys() + ((TARGET_KEY,) if TARGET_KEY in batch else ())
        return {k: batch[k] for k in keys}

    def state_shardings(self, state: TrainState) -> TrainState:
        """Target shardings of ``state`` on the mesh (params by the partition rules)."""
        mesh = self.mesh
        param_sh = shd.param_shardings(state.params, mesh)
        rep = NamedSharding(mesh, P())
        opt_sh = _mirror_param_shardings(state.opt_state, state.params, param_sh, rep)
        return TrainState(params=param_sh, opt_state=opt_sh, step=rep, rng=rep)

    def _grads_fn(self, state: TrainState, batch: dict[str, jax.Array], frozen=None):
        """Forward and backward: the gradients (summed over micro-batches, divided once, in the params'
        dtype) and the loss metrics. Reads the state, changes nothing."""
        graphdef, micro, remat, mesh = self.graphdef, self.micro, self.remat, self.mesh
        loss = loss_from_config(self.loss_cfg)
        _check_rows(batch, micro)
        params = state.params
        # Adapter dropout's key: a function of the checkpointed key and step, so a resumed run redraws
        # the same masks. Without adapters (or dropout) the model ignores it.
        step_key = jax.random.fold_in(jax.random.fold_in(state.rng, _DROPOUT_STREAM), state.step)

        def loss_fn(p, mb, key):
            logp, entropy = _model_logprobs(graphdef, p, mb, remat, frozen, key)
            num, den, sums = loss(
                logp, mb["old_logprobs"], mb.get("ref_logprobs"), mb["advantages"], mb["loss_mask"], entropy
            )
            return num, (den, sums)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if micro == 1:
            (num, (den, sums)), grads = grad_fn(params, batch, step_key)
        else:
            mbs = _micro_constraint(mesh, jax.tree.map(lambda x: _split_micro(x, micro), batch))
            first = jax.tree.map(lambda x: x[0], mbs)
            _, (_, sums_shape) = jax.eval_shape(loss_fn, params, first, step_key)
            zeros = (
                jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
                jnp.zeros((), jnp.float32),
                jnp.zeros((), jnp.float32),
                jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
            )

            def body(carry, inputs):
                g_acc, num_acc, den_acc, s_acc = carry
                i, mb = inputs
                (num, (den, sums)), g = grad_fn(params, mb, jax.random.fold_in(step_key, i))
                g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
                s_acc = jax.tree.map(jnp.add, s_acc, sums)
                return (g_acc, num_acc + num, den_acc + den, s_acc), None

            (grads, num, den, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(micro), mbs))

        scale = 1.0 / jnp.maximum(den, 1.0)
        grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, params)
        metrics = dict(reduce_metrics(sums))
        metrics.update(loss=num * scale, grad_norm=optax.tree.norm(grads), loss_denominator=den)
        return grads, metrics

    def _apply_fn(self, state: TrainState, grads: Any):
        """The optimizer update of ``state`` by ``grads``; reports the learning rate it used."""
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        lr = _current_lr(opt_state)
        new_state = TrainState(params=new_params, opt_state=opt_state, step=state.step + 1, rng=state.rng)
        return new_state, ({} if lr is None else {"lr": lr})

    def _step_fn(self, state: TrainState, batch: dict[str, jax.Array], frozen=None):
        """Both phases as one function (what ``lower`` compiles for the memory planner)."""
        grads, metrics = self._grads_fn(state, batch, frozen)
        state, extra = self._apply_fn(state, grads)
        return state, {**metrics, **extra}

    def _build(self, state: TrainState, batch: Mapping[str, Any], frozen, fused: bool = False):
        """(gradient program, optimizer program, state shardings), or with ``fused`` the one-program step."""
        if self.mesh is None:
            if fused:
                return jax.jit(self._step_fn, donate_argnums=0)
            return jax.jit(self._grads_fn), jax.jit(self._apply_fn, donate_argnums=0), None
        state_sh = self.state_shardings(state)
        rep = NamedSharding(self.mesh, P())
        frozen_sh = shd.param_shardings(frozen, self.mesh) if frozen is not None else None
        in_sh = (state_sh, _batch_shardings(self.mesh, batch), frozen_sh)
        if fused:
            return jax.jit(self._step_fn, in_shardings=in_sh, out_shardings=(state_sh, rep), donate_argnums=0)
        grads = jax.jit(self._grads_fn, in_shardings=in_sh, out_shardings=(state_sh.params, rep))
        apply = jax.jit(
            self._apply_fn,
            in_shardings=(state_sh, state_sh.params),
            out_shardings=(state_sh, rep),
            donate_argnums=0,
        )
        return grads, apply, state_sh

    def lower(self, state: TrainState, batch: Mapping[str, Any], frozen=None) -> jax.stages.Lowered:
        """Both phases as one compiled program for these (possibly abstract) inputs, placed as a call
        places them: what the memory planner measures (the two programs a call runs peak no higher)."""
        inputs = self._inputs(batch)
        return self._build(state, inputs, frozen, fused=True).lower(state, inputs, frozen)

    def __call__(
        self, state: TrainState, batch: Mapping[str, Any], frozen=None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        missing = [k for k in self.batch_keys() if k not in batch]
        if missing:
            raise ValueError(f"batch lacks {missing}; pack_rows gives the grid, add advantages and log-probs")
        inputs = self._inputs(batch)
        key = (
            jax.tree_util.tree_structure((state, frozen)),
            tuple((k, np.ndim(v)) for k, v in inputs.items()),
        )
        if key not in self._jitted:
            self._jitted[key] = self._build(state, inputs, frozen)
        grads_fn, apply_fn, state_sh = self._jitted[key]
        if self.mesh is not None:
            state = jax.device_put(state, state_sh)
            inputs = jax.device_put(inputs, _batch_shardings(self.mesh, inputs))
        start = time.perf_counter()
        grads, metrics = jax.block_until_ready(grads_fn(state, inputs, frozen))
        middle = time.perf_counter()
        state, extra = jax.block_until_ready(apply_fn(state, grads))
        self.times = {"forward_backward": middle - start, "optimizer": time.perf_counter() - middle}
        return state, {**metrics, **extra}


def make_train_step(
    graphdef,
    optimizer: optax.GradientTransformation,
    loss_cfg: LossConfig | Mapping[str, Any] | None,
    mesh: Mesh | None = None,
    micro_batches: int = 1,
    remat: bool = False,
) -> TrainStep:
    """The PPO update as one jitted pure function ``(state, batch) -> (state, metrics)``, state donated.

    ``batch``: ``pack_rows`` keys (input_ids, attention_mask, positions, loss_mask, each [B, T]) plus
    ``advantages`` [B] or [B, T], ``old_logprobs`` [B, T] and, unless ``kl_type='none'``,
    ``ref_logprobs`` [B, T] (``make_logprob_fn``). B must be divisible by ``micro_batches`` (and, on a
    mesh, each micro-batch by the data x fsdp size). ``remat`` turns on the model's per-layer
    rematerialisation. Metrics (replicated scalars): loss, pg_loss, kl_ref, entropy, clip_frac,
    dual_clip_frac, approx_kl, ratio (token means), tokens, loss_denominator, grad_norm (before
    clipping), lr. With ``target_index`` (``pack_rows``) the LM head runs at the response columns only.
    """
    return TrainStep(graphdef, optimizer, LossConfig.from_any(loss_cfg), mesh, micro_batches, remat)


# --------------------------------------------------------------------------------------------------
# packing


def _round_up(n: int, bucket: int | Sequence[int]) -> int:
    if isinstance(bucket, int):
        if bucket < 1:
            raise ValueError(f"length_bucket must be >= 1, got {bucket}")
        return -(-n // bucket) * bucket
    sizes = sorted(int(b) for b in bucket)
    if not sizes or sizes[0] < 1:
        raise ValueError(f"length_bucket must be a positive int or a non-empty list of them, got {bucket}")
    for s in sizes:
        if s >= n:
            return s
    return -(-n // sizes[-1]) * sizes[-1]


def pack_rows(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    max_prompt: int | None = None,
    max_response: int | None = None,
    length_bucket: int | Sequence[int] = 64,
    response_logprobs: Sequence[Sequence[float]] | None = None,
    stats: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Rows on one token grid ``[N, T]``: prompts left-padded to the longest prompt, responses right after
    them, right-padded; ``T`` rounded up to ``length_bucket`` (an int multiple, or the smallest of a list
    of sizes) so few shapes get compiled.

    Prompts longer than ``max_prompt`` lose tokens from the LEFT (the recent context matters most);
    responses longer than ``max_response`` are cut on the right. Counts are logged as a warning and,
    with ``stats``, stored as ``stats['prompts_truncated']`` / ``stats['responses_truncated']``.
    Returns numpy arrays: input_ids, attention_mask, positions (int32; positions count real tokens from
    0, padding 0), loss_mask (float32, 1 on response tokens), target_index (``target_index``: the
    response columns, where the model's head runs), and sampler_logprobs (float32, on response
    tokens) when ``response_logprobs`` is given.
    """
    n = len(prompt_ids)
    if n == 0:
        raise ValueError("pack_rows needs at least one row")
    if len(response_ids) != n:
        raise ValueError(f"{n} prompts but {len(response_ids)} responses")
    if response_logprobs is not None and len(response_logprobs) != n:
        raise ValueError(f"{n} responses but {len(response_logprobs)} response_logprobs rows")
    prompts, responses, logprobs = [], [], []
    cut_p = cut_r = 0
    for i in range(n):
        p = np.asarray(prompt_ids[i], np.int64).reshape(-1)
        r = np.asarray(response_ids[i], np.int64).reshape(-1)
        if p.size == 0:
            raise ValueError(f"row {i} has an empty prompt: the first response token needs a predecessor")
        if max_prompt is not None and p.size > max_prompt:
            p, cut_p = p[-max_prompt:], cut_p + 1
        if max_response is not None and r.size > max_response:
            r, cut_r = r[:max_response], cut_r + 1
        if response_logprobs is not None:
            lp = np.asarray(response_logprobs[i], np.float32).reshape(-1)
            if lp.size < r.size:
                raise ValueError(f"row {i}: {lp.size} log-probs for {r.size} response tokens")
            logprobs.append(lp[: r.size])
        prompts.append(p)
        responses.append(r)
    if cut_p or cut_r:
        log.warning(
            "pack_rows: %d/%d prompts truncated from the left to %s tokens, %d responses cut to %s",
            cut_p,
            n,
            max_prompt,
            cut_r,
            max_response,
        )
    if stats is not None:
        stats["prompts_truncated"] = cut_p
        stats["responses_truncated"] = cut_r

    width_p = max(p.size for p in prompts)
    width = _round_up(width_p + max(r.size for r in responses), length_bucket)
    input_ids = np.full((n, width), pad_id, np.int32)
    attention = np.zeros((n, width), np.int32)
    positions = np.zeros((n, width), np.int32)
    loss_mask = np.zeros((n, width), np.float32)
    sampler_lp = np.zeros((n, width), np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        start, end = width_p - p.size, width_p + r.size
        input_ids[i, start:width_p] = p
        input_ids[i, width_p:end] = r
        attention[i, start:end] = 1
        positions[i, start:end] = np.arange(end - start)
        loss_mask[i, width_p:end] = 1.0
        if response_logprobs is not None:
            sampler_lp[i, width_p:end] = logprobs[i]
    out = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "positions": positions,
        "loss_mask": loss_mask,
        TARGET_KEY: target_index(loss_mask),
    }
    if response_logprobs is not None:
        out["sampler_logprobs"] = sampler_lp
    return out


def ppo_batch(
    rows: Sequence[Any],
    advantages: np.ndarray,
    *,
    pad_id: int,
    max_prompt: int,
    max_response: int,
    mini_batch_rows: int,
    old_logprobs: Callable[[dict[str, jax.Array]], np.ndarray] | None = None,
    ref_logprobs: Callable[[dict[str, jax.Array]], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """One iteration's rows (``types.Row``) as PPO's host batch: the token grid, advantages, and the
    old-policy and reference log-probs, padded to whole mini-batches with zero-weight rows (every
    step then has one shape and one compile).

    The log-probs are fixed for every row before the first step, so the ratio of later mini-batches
    measures how far the policy moved in this iteration. `old_logprobs=None` takes the sampler's own
    (the same quantity: log_softmax of the raw logits, prompts cut to the same limit), one forward pass
    fewer; `ref_logprobs=None` makes the reference the old policy (no KL pass).
    """
    packed = pack_rows(
        [r.prompt_ids for r in rows],
        [r.response_ids for r in rows],
        pad_id,
        max_prompt=max_prompt,
        max_response=max_response,
        response_logprobs=[r.logprobs for r in rows] if old_logprobs is None else None,
    )
    n, mb = len(rows), mini_batch_rows
    padded = -(-n // mb) * mb
    fill = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
    packed = {k: v[fill] for k, v in packed.items()}
    packed["loss_mask"][n:] = 0  # padding rows repeat row 0 but weigh nothing
    packed["advantages"] = advantages[fill].astype(np.float32)

    def chunked(fn: Callable[[dict[str, jax.Array]], np.ndarray]) -> np.ndarray:
        keys = (*MODEL_KEYS, "loss_mask", TARGET_KEY)
        return np.concatenate(
            [fn({k: jnp.asarray(packed[k][s : s + mb]) for k in keys}) for s in range(0, padded, mb)]
        )

    packed["old_logprobs"] = packed.pop("sampler_logprobs") if old_logprobs is None else chunked(old_logprobs)
    packed["ref_logprobs"] = chunked(ref_logprobs) if ref_logprobs is not None else packed["old_logprobs"]
    return packed


def ppo_epochs(
    train_step: TrainStep,
    state: TrainState,
    packed: dict[str, np.ndarray],
    n_rows: int,
    *,
    mini_batch_rows: int,
    epochs: int,
    rng: np.random.Generator,
    frozen: Any = None,
) -> tuple[TrainState, dict[str, float]]:
    """PPO epochs over shuffled mini-batches of a `ppo_batch` (its first `n_rows` rows are real; the
    padding rows stay last). Returns the new state, each metric's mean over the steps and each phase's
    total seconds (``time/update/forward_backward``, ``time/update/optimizer``)."""
    padded, mb = len(packed["advantages"]), mini_batch_rows
    sums: dict[str, list[float]] = {}
    times: dict[str, float] = {}
    for _ in range(epochs):
        order = np.concatenate([rng.permutation(n_rows), np.arange(n_rows, padded)])
        for start in range(0, padded, mb):
            idx = order[start : start + mb]
            state, metrics = train_step(state, {k: jnp.asarray(v[idx]) for k, v in packed.items()}, frozen)
            for k, v in metrics.items():
                sums.setdefault(f"update/{k}", []).append(float(v))
            for k, v in getattr(train_step, "times", {}).items():  # a TrainStep times its phases
                times[f"time/update/{k}"] = times.get(f"time/update/{k}", 0.0) + v
    return state, {**{k: float(np.mean(v)) for k, v in sums.items()}, **times}
