"""Token log-probs from the model on the packed token grid, and the jitted log-prob pass.

Token grid (``ppo.pack_rows``): each row is ``[left pad | prompt | response | right pad]``, all rows
share the prompt/response boundary. Alignment: ``logprobs[:, t]`` is the log-probability of token ``t``
given tokens ``< t``, i.e. it comes from the logits at ``t - 1``; column 0 has no predictor and is 0.
``loss_mask`` is 1 exactly on response tokens, so old/ref/new log-probs, per-token advantages and the
mask all index the same grid. ``target_index`` ``[B, K]`` lists each row's response columns (K a
bucketed width, padding 0): with it the LM head (logits, log-sum-exp, entropy over the vocabulary) runs
on the hidden states of those K positions only, the ~30 response tokens of a ~250-token row, and the
results are scattered back onto the grid (0 elsewhere). Without it every column is scored.

Micro-batches split a batch's rows so that every device's row block contributes to each of them
(``split_micro``): the log-prob pass and the train step share these helpers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from roleagent_jax.parallel import sharding as shd

MODEL_KEYS = ("input_ids", "attention_mask", "positions")
TARGET_KEY = "target_index"
TARGET_BUCKET = 16  # target widths are rounded up to a multiple of this: few compiled shapes


def round_up(n: int, bucket: int | Sequence[int]) -> int:
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
    width = min(mask.shape[1], max(round_up(int(mask.sum(1).max(initial=0)), bucket), bucket))
    out = np.zeros((mask.shape[0], width), np.int32)
    for i, row in enumerate(mask):
        cols = np.flatnonzero(row)
        out[i, : cols.size] = cols
    return out


def model_logprobs(graphdef, params, batch, remat: bool, frozen=None, dropout_key=None):
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


def split_micro(x: jax.Array, micro: int) -> jax.Array:
    """[B, ...] -> [micro, B / micro, ...], micro-batch i = rows i, i + micro, ... so every device's row
    block contributes to every micro-batch (no resharding between scan iterations)."""
    b = x.shape[0]
    return jnp.swapaxes(x.reshape(b // micro, micro, *x.shape[1:]), 0, 1)


def merge_micro(x: jax.Array) -> jax.Array:
    m, r = x.shape[:2]
    return jnp.swapaxes(x, 0, 1).reshape(m * r, *x.shape[2:])


def check_rows(batch: Mapping[str, Any], micro: int) -> int:
    rows = batch["input_ids"].shape[0]
    if micro < 1 or rows % micro:
        raise ValueError(f"batch has {rows} rows, not divisible by micro_batches={micro}: pad the batch")
    return rows


def batch_shardings(mesh: Mesh, batch: Mapping[str, Any]) -> dict[str, NamedSharding]:
    return {k: shd.batch_sharding(mesh, np.ndim(v)) for k, v in batch.items()}


def micro_constraint(mesh: Mesh | None, tree: Any) -> Any:
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
            check_rows(batch, micro)
            mask = batch["attention_mask"] > 0
            if micro == 1:
                lp, _ = model_logprobs(graphdef, params, batch, False, frozen)
            else:
                mbs = micro_constraint(mesh, jax.tree.map(lambda x: split_micro(x, micro), batch))
                lp = merge_micro(
                    jax.lax.map(lambda mb: model_logprobs(graphdef, params, mb, False, frozen)[0], mbs)
                )
            return jnp.where(mask, lp, 0.0)

        if mesh is None:
            return jax.jit(fn)
        in_sh = (
            shd.param_shardings(params, mesh),
            batch_shardings(mesh, batch),
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
            inputs = jax.device_put(inputs, batch_shardings(self.mesh, inputs))
        return fn(params, inputs, frozen)


def make_logprob_fn(graphdef, mesh: Mesh | None = None, micro_batches: int = 1) -> LogprobFn:
    """Jitted token log-probs of the ``pack_rows`` grid, e.g. the old-policy and reference log-probs
    computed once per batch before the update (at its ``target_index`` columns when it has them;
    other batch keys are ignored)."""
    return LogprobFn(graphdef, mesh, micro_batches)
