"""Picking the next token from logits: greedy, temperature, top-k, top-p; plus its training log-prob.

The choice rule is fixed by static flags (`greedy`, `top_k`, `use_top_p`) so that the common paths
stay cheap: greedy is one argmax, top-k works on k candidates only, and the full-vocabulary sort that
top-p needs is compiled in only when top-p (without top-k) is asked for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def argmax_last(x: jnp.ndarray) -> jnp.ndarray:
    """First index of the maximum along the last axis, like jnp.argmax but as two plain reductions
    (max, then min over matching indices), which XLA on CPU runs several times faster than its
    variadic argmax reduction; this sits on the per-token critical path of decoding."""
    size = x.shape[-1]
    best = jnp.max(x, axis=-1, keepdims=True)
    idx = jnp.min(jnp.where(x == best, jnp.arange(size, dtype=jnp.int32), size), axis=-1)
    return jnp.minimum(idx, size - 1).astype(jnp.int32)


def _draw(key: jax.Array, logits: jnp.ndarray) -> jnp.ndarray:
    """One categorical draw per row (Gumbel-max trick; -inf logits are never drawn)."""
    return argmax_last(logits + jax.random.gumbel(key, logits.shape, jnp.float32))


def _nucleus(sorted_logits: jnp.ndarray, top_p: jnp.ndarray) -> jnp.ndarray:
    """Mask (to -inf) the tail of descending-sorted logits outside the smallest set with mass >= top_p."""
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    return jnp.where(mass_before < top_p, sorted_logits, -jnp.inf)


def choose_tokens(
    logits: jnp.ndarray,
    key: jax.Array,
    temperature: jnp.ndarray,
    top_p: jnp.ndarray,
    *,
    greedy: bool,
    top_k: int,
    use_top_p: bool,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Choose one token per row and return (ids int32 [B], logprobs float32 [B]).

    The log-prob is that of the chosen token under the *untempered, untruncated* policy,
    log_softmax(logits)[token]: the quantity a PPO-style ratio compares against the training forward,
    which knows nothing of temperature, top-k or top-p.
    """
    logits = logits.astype(jnp.float32)
    if greedy:
        tokens = argmax_last(logits)
    else:
        scaled = logits / temperature
        if top_k > 0:
            cand, cand_ids = jax.lax.top_k(scaled, top_k)
            if use_top_p:
                cand = _nucleus(cand, top_p)
            pick = _draw(key, cand)
            tokens = jnp.take_along_axis(cand_ids, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)
        elif use_top_p:
            order = jnp.argsort(-scaled, axis=-1)
            cand = _nucleus(jnp.take_along_axis(scaled, order, axis=-1), top_p)
            pick = _draw(key, cand)
            tokens = jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)
        else:
            tokens = _draw(key, scaled)
    chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen - jax.nn.logsumexp(logits, axis=-1)
