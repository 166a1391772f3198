"""Token-level clipped policy loss (PPO clip + dual-clip), KL to a frozen reference, entropy bonus.

The loss is returned as ``(numerator, denominator, metric_sums)``: summing numerators, denominators and
metric sums over micro-batches and dividing once gives exactly the full-batch value, whatever the split
(a mean of per-micro-batch means would weight small micro-batches too much).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

KLType = Literal["low_var_kl", "kl", "none"]
Agg = Literal["token-mean", "seq-mean-token-mean"]
KL_TYPES = ("low_var_kl", "kl", "none")
AGGS = ("token-mean", "seq-mean-token-mean")
# The log-ratio is clamped before exp so a stale or corrupted old log-prob cannot overflow the ratio.
_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Hyper-parameters of ``policy_loss`` (defaults: the reference runs, section 5)."""

    clip_eps: float = 0.2
    dual_clip: float | None = 3.0
    kl_type: KLType = "low_var_kl"
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    agg: Agg = "token-mean"

    def __post_init__(self) -> None:
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
        if self.agg not in AGGS:
            raise ValueError(f"agg must be one of {AGGS}, got {self.agg!r}")
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must lie in (0, 1), got {self.clip_eps}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None to disable), got {self.dual_clip}")

    @classmethod
    def from_any(cls, cfg: LossConfig | Mapping[str, Any] | None) -> LossConfig:
        """Accept a LossConfig, a plain dict or an ml_collections ConfigDict (unknown keys are an error)."""
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(items) - names
        if unknown:
            raise ValueError(f"unknown loss options {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**items)


def token_kl(logp: jax.Array, ref_logp: jax.Array, kl_type: KLType) -> jax.Array:
    """Per-token KL estimate of the policy from the reference, sampled under the policy.

    ``kl``: k1 = log p - log p_ref (unbiased, high variance). ``low_var_kl``: k3 = exp(d) - d - 1 with
    d = log p_ref - log p, always >= 0, clamped to [-10, 10] as verl does to bound rare outliers.
    """
    if kl_type == "kl":
        return logp - ref_logp
    if kl_type == "low_var_kl":
        d = jnp.clip(ref_logp - logp, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        return jnp.clip(jnp.exp(d) - d - 1.0, -_K3_BOUND, _K3_BOUND)
    raise ValueError(f"kl_type must be 'kl' or 'low_var_kl' here, got {kl_type!r}")


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    ref_logp: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    entropy: jax.Array | None = None,
    *,
    clip_eps: float = 0.2,
    dual_clip: float | None = 3.0,
    kl_type: KLType = "low_var_kl",
    kl_coef: float = 0.01,
    entropy_coef: float = 0.001,
    agg: Agg = "token-mean",
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + ``kl_coef`` * KL(ref) - ``entropy_coef`` * entropy, aggregated as num / den.

    Shapes: ``logp``, ``old_logp``, ``ref_logp``, ``mask``, ``entropy`` are [B, T] (token grid, see
    ``ppo.pack_rows``); ``advantages`` is [B] (broadcast over the row's tokens) or [B, T].

    Per token with ratio r = exp(logp - old_logp) and advantage A:
      ``max(-A r, -A clip(r, 1-eps, 1+eps))``, and for A < 0 additionally capped at ``-A * dual_clip``
      (dual-clip: a very large ratio on a bad action cannot blow the loss up).
    Aggregation: ``token-mean`` -> num = sum over masked tokens, den = their count;
    ``seq-mean-token-mean`` -> num = sum over rows of the row's token mean, den = rows with >= 1 token.

    ``metric_sums`` hold sums over masked tokens plus ``tokens``; ``reduce_metrics`` turns accumulated
    sums into means. Keys: pg_loss, clip_frac (clipped branch active), dual_clip_frac, approx_kl (k1 to
    the old policy), kl_ref (when KL is on), entropy (when given), ratio.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type must be one of {KL_TYPES}, got {kl_type!r}")
    if agg not in AGGS:
        raise ValueError(f"agg must be one of {AGGS}, got {agg!r}")
    if logp.ndim != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share one [B, T] shape, got {logp.shape}, {old_logp.shape}, {mask.shape}"
        )
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    if advantages.shape not in ((logp.shape[0], 1), logp.shape):
        raise ValueError(f"advantages must be [B] or [B, T] for logp {logp.shape}, got {advantages.shape}")
    use_kl = kl_type != "none"
    if use_kl and ref_logp is None:
        raise ValueError(f"kl_type={kl_type!r} needs ref_logp; pass kl_type='none' to train without KL")

    live = mask > 0
    weight = live.astype(jnp.float32)
    adv = advantages.astype(jnp.float32)
    log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = jnp.exp(log_ratio)
    loss_plain = -adv * ratio
    loss_clip = -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    pg = jnp.maximum(loss_plain, loss_clip)
    clip_hit = loss_clip > loss_plain
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_hit = (adv < 0) & (pg > cap)
        pg = jnp.where(adv < 0, jnp.minimum(pg, cap), pg)
    else:
        dual_hit = jnp.zeros_like(live)

    per_token = pg
    kl = None
    if use_kl:
        kl = token_kl(logp, ref_logp, kl_type)
        per_token = per_token + kl_coef * kl
    if entropy is not None:
        per_token = per_token - entropy_coef * entropy
    per_token = jnp.where(live, per_token, 0.0)

    if agg == "token-mean":
        num = per_token.sum()
        den = weight.sum()
    else:
        row_tokens = weight.sum(axis=1)
        num = (per_token.sum(axis=1) / jnp.maximum(row_tokens, 1.0)).sum()
        den = (row_tokens > 0).astype(jnp.float32).sum()

    def tsum(x):
        return jnp.where(live, x, 0.0).astype(jnp.float32).sum()

    metrics = {
        "tokens": weight.sum(),
        "pg_loss": tsum(pg),
        "clip_frac": tsum(clip_hit),
        "dual_clip_frac": tsum(dual_hit),
        "approx_kl": tsum(old_logp - logp),
        "ratio": tsum(ratio),
    }
    if kl is not None:
        metrics["kl_ref"] = tsum(kl)
    if entropy is not None:
        metrics["entropy"] = tsum(entropy)
    return num, den, metrics


def reduce_metrics(metric_sums: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Token means from (accumulated) metric sums; ``tokens`` stays a count."""
    tokens = metric_sums["tokens"]
    safe = jnp.maximum(tokens, 1.0)
    return {k: (v if k == "tokens" else v / safe) for k, v in metric_sums.items()}


def loss_from_config(cfg: LossConfig):
    """``policy_loss`` with the keyword options bound from a LossConfig."""

    def fn(logp, old_logp, ref_logp, advantages, mask, entropy=None):
        return policy_loss(
            logp,
            old_logp,
            ref_logp,
            advantages,
            mask,
            entropy,
            clip_eps=cfg.clip_eps,
            dual_clip=cfg.dual_clip,
            kl_type=cfg.kl_type,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
            agg=cfg.agg,
        )

    return fn
