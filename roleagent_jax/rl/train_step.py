"""The policy update: one jitted optimizer step on a packed token grid (``ppo.pack_rows``; the grid and
its log-probs are described in `logprobs`).

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

import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from roleagent_jax.parallel import sharding as shd
from roleagent_jax.rl.logprobs import (
    MODEL_KEYS,
    TARGET_KEY,
    batch_shardings,
    check_rows,
    micro_constraint,
    model_logprobs,
    split_micro,
)
from roleagent_jax.rl.losses import LossConfig, loss_from_config, reduce_metrics
from roleagent_jax.rl.optimizer import TrainState, current_lr, mirror_param_shardings

_DROPOUT_STREAM = 0x10A  # folded into the state's key: adapter dropout draws its own random stream


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
        keys = (*keys, "guided_weight") if self.loss_cfg.guided != "none" else keys
        return (*keys, "ref_logprobs") if self.loss_cfg.kl_type != "none" else keys

    def _inputs(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        keys = self.batch_keys() + ((TARGET_KEY,) if TARGET_KEY in batch else ())
        return {k: batch[k] for k in keys}

    def state_shardings(self, state: TrainState) -> TrainState:
        """Target shardings of ``state`` on the mesh (params by the partition rules)."""
        mesh = self.mesh
        param_sh = shd.param_shardings(state.params, mesh)
        rep = NamedSharding(mesh, P())
        opt_sh = mirror_param_shardings(state.opt_state, state.params, param_sh, rep)
        return TrainState(params=param_sh, opt_state=opt_sh, step=rep, rng=rep)

    def _grads_fn(self, state: TrainState, batch: dict[str, jax.Array], frozen=None):
        """Forward and backward: the gradients (summed over micro-batches, divided once, in the params'
        dtype) and the loss metrics. Reads the state, changes nothing."""
        graphdef, micro, remat, mesh = self.graphdef, self.micro, self.remat, self.mesh
        loss = loss_from_config(self.loss_cfg)
        check_rows(batch, micro)
        params = state.params
        # Adapter dropout's key: a function of the checkpointed key and step, so a resumed run redraws
        # the same masks. Without adapters (or dropout) the model ignores it.
        step_key = jax.random.fold_in(jax.random.fold_in(state.rng, _DROPOUT_STREAM), state.step)

        def loss_fn(p, mb, key):
            logp, entropy = model_logprobs(graphdef, p, mb, remat, frozen, key)
            num, den, sums = loss(
                logp, mb["old_logprobs"], mb.get("ref_logprobs"), mb["advantages"], mb["loss_mask"], entropy,
                mb.get("guided_weight"),
            )  # fmt: skip
            return num, (den, sums)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if micro == 1:
            (num, (den, sums)), grads = grad_fn(params, batch, step_key)
        else:
            mbs = micro_constraint(mesh, jax.tree.map(lambda x: split_micro(x, micro), batch))
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
        lr = current_lr(opt_state)
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
        in_sh = (state_sh, batch_shardings(self.mesh, batch), frozen_sh)
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
            inputs = jax.device_put(inputs, batch_shardings(self.mesh, inputs))
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
    ``ref_logprobs`` [B, T] (``make_logprob_fn``), and with a guided loss (``loss_cfg.guided``)
    ``guided_weight`` [B, T] (``ppo.ppo_batch``). B must be divisible by ``micro_batches`` (and, on a
    mesh, each micro-batch by the data x fsdp size). ``remat`` turns on the model's per-layer
    rematerialisation. Metrics (replicated scalars): loss, pg_loss, kl_ref, entropy, clip_frac,
    dual_clip_frac, approx_kl, ratio (token means), tokens, loss_denominator, grad_norm (before
    clipping), lr. With ``target_index`` (``pack_rows``) the LM head runs at the response columns only.
    """
    return TrainStep(graphdef, optimizer, LossConfig.from_any(loss_cfg), mesh, micro_batches, remat)
