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
Guided = Literal["none", "shaped", "nll"]
KL_TYPES = ("low_var_kl", "kl", "none")
AGGS = ("token-mean", "seq-mean-token-mean")
GUIDED = ("none", "shaped", "nll")
# The log-ratio is clamped before exp so a stale or corrupted old log-prob cannot overflow the ratio.
_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Hyper-parameters of ``policy_loss`` (defaults: the reference runs, section 5)."""

    clip_eps: float = 0.2
    clip_eps_high: float = 0.0  # 0: clip_eps (symmetric clip)
    dual_clip: float | None = 3.0
    kl_type: KLType = "low_var_kl"
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    agg: Agg = "token-mean"
    guided: Guided = "none"
    guided_gamma: float = 0.1
    guided_mu: float = 0.9
    guided_mu_end: float = 0.05

    def __post_init__(self) -> None:
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
        if self.guided not in GUIDED:
            raise ValueError(f"guided must be one of {GUIDED}, got {self.guided!r}")
        if self.guided_gamma <= 0.0:
            raise ValueError(f"guided_gamma must be > 0, got {self.guided_gamma}")
        if self.agg not in AGGS:
            raise ValueError(f"agg must be one of {AGGS}, got {self.agg!r}")
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must lie in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high < 0.0:
            raise ValueError(f"clip_eps_high must be >= 0 (0 = clip_eps), got {self.clip_eps_high}")
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

    def guided_weight(self, iteration: int, iterations: int) -> float | None:
        """The weight of the expert's tokens at ``iteration`` of ``iterations``: None without a guided
        loss, 1 for ``shaped`` (the advantage scales it), and for ``nll`` CHORD's mu, linear from
        ``guided_mu`` at the first iteration to ``guided_mu_end`` at the last (the guidance fades as the
        policy learns to find the expert's step itself)."""
        if self.guided == "none":
            return None
        if self.guided == "shaped":
            return 1.0
        done = iteration / max(iterations - 1, 1)
        return float(self.guided_mu + (self.guided_mu_end - self.guided_mu) * min(done, 1.0))


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
    clip_eps_high: float = 0.0,
    dual_clip: float | None = 3.0,
    kl_type: KLType = "low_var_kl",
    kl_coef: float = 0.01,
    entropy_coef: float = 0.001,
    agg: Agg = "token-mean",
    guided_weight: jax.Array | None = None,
    guided: Guided = "none",
    guided_gamma: float = 0.1,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + ``kl_coef`` * KL(ref) - ``entropy_coef`` * entropy, aggregated as num / den.

    Shapes: ``logp``, ``old_logp``, ``ref_logp``, ``mask``, ``entropy`` are [B, T] (token grid, see
    ``ppo.pack_rows``); ``advantages`` is [B] (broadcast over the row's tokens) or [B, T].

    Per token with ratio r = exp(logp - old_logp) and advantage A:
      ``max(-A r, -A clip(r, 1-eps, 1+eps_high))``, and for A < 0 additionally capped at ``-A * dual_clip``
      (dual-clip: a very large ratio on a bad action cannot blow the loss up). ``eps_high`` is
      ``clip_eps_high``, or ``clip_eps`` when that is 0: a higher upper clip (DAPO's Clip-Higher) lets a
      rare good token's probability grow further in one update, which keeps entropy from collapsing.
    Aggregation: ``token-mean`` -> num = sum over masked tokens, den = their count;
    ``seq-mean-token-mean`` -> num = sum over rows of the row's token mean, den = rows with >= 1 token.

    Guided tokens (``guided_weight`` [B, T] > 0 on masked tokens: the expert's forced step,
    ``ppo.pack_rows``) were chosen by the expert, not sampled, so the policy's ratio, its clip, and the
    KL and entropy estimates (expectations under the policy's own samples) do not apply to them; each
    gets instead, with w its weight and p = exp(logp):
      ``shaped`` (LUFFY): ``-A * w * p / (p + gamma)``, unclipped. Its gradient in log p,
        ``A p gamma / (p + gamma)^2``, is ~1/gamma times the raw off-policy ratio's (p / 1) for small p,
        peaks at p = gamma (A / 4), and fades as p -> 1: a push that does not saturate the expert's
        tokens, and, through A, one that pulls a losing expert step down.
      ``nll`` (CHORD): ``-w * logp`` (w = mu of the iteration): the expert's step imitated whatever
        the advantage; its gradient in log p is w at every p, so it moves even a token the policy gives
        1%, where ``shaped`` (A p / gamma there, 0.08 A at p = 0.01) and the ratio-1 PPO term
        (clipped once p rose 20% above the old policy's) barely do.
    ``guided="none"`` (or no ``guided_weight``) is the plain loss above, unchanged.

    ``metric_sums`` hold sums over masked tokens plus ``tokens``; ``reduce_metrics`` turns accumulated
    sums into means. Keys: pg_loss, clip_frac (clipped branch active), clip_frac_low (ratio below 1-eps
    with A < 0), clip_frac_high (ratio above 1+eps_high with A > 0; the two add up to clip_frac),
    dual_clip_frac, approx_kl (k1 to the old policy), kl_ref (when KL is on), entropy (when given),
    ratio; with a guided loss also guided_tokens and guided_prob (the policy's mean probability of the
    expert's tokens).
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type must be one of {KL_TYPES}, got {kl_type!r}")
    if agg not in AGGS:
        raise ValueError(f"agg must be one of {AGGS}, got {agg!r}")
    if guided not in GUIDED:
        raise ValueError(f"guided must be one of {GUIDED}, got {guided!r}")
    if guided != "none" and guided_weight is None:
        raise ValueError(f"guided={guided!r} needs guided_weight (ppo_batch's grid of the expert's tokens)")
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
    eps_high = clip_eps_high or clip_eps
    loss_clip = -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    pg = jnp.maximum(loss_plain, loss_clip)
    clip_hit = loss_clip > loss_plain
    clip_low = (adv < 0) & (ratio < 1.0 - clip_eps)
    clip_high = (adv > 0) & (ratio > 1.0 + eps_high)
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
    expert = None
    if guided != "none":
        w = guided_weight.astype(jnp.float32)
        expert = live & (w > 0)
        if guided == "shaped":
            p = jnp.exp(logp)
            guided_loss = -adv * w * p / (p + guided_gamma)
        else:
            guided_loss = -w * logp
        per_token = jnp.where(expert, guided_loss, per_token)
        pg = jnp.where(expert, guided_loss, pg)
        clip_hit = clip_hit & ~expert
        dual_hit = dual_hit & ~expert
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
        "clip_frac_low": tsum(clip_low),
        "clip_frac_high": tsum(clip_high),
        "dual_clip_frac": tsum(dual_hit),
        "approx_kl": tsum(old_logp - logp),
        "ratio": tsum(ratio),
    }
    if kl is not None:
        metrics["kl_ref"] = tsum(kl)
    if entropy is not None:
        metrics["entropy"] = tsum(entropy)
    if expert is not None:
        metrics["guided_tokens"] = expert.astype(jnp.float32).sum()
        metrics["guided_prob"] = jnp.where(expert, jnp.exp(logp), 0.0).sum()
    return num, den, metrics


def reduce_metrics(metric_sums: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Token means from (accumulated) metric sums; the counts (``tokens``, ``guided_tokens``) stay counts
    and ``guided_prob`` is a mean over the expert's tokens."""
    out = {}
    for k, v in metric_sums.items():
        count = {"tokens": None, "guided_tokens": None, "guided_prob": "guided_tokens"}.get(k, "tokens")
        out[k] = v if count is None else v / jnp.maximum(metric_sums[count], 1.0)
    return out


def loss_from_config(cfg: LossConfig):
    """``policy_loss`` with the keyword options bound from a LossConfig."""

    def fn(logp, old_logp, ref_logp, advantages, mask, entropy=None, guided_weight=None):
        return policy_loss(
            logp,
            old_logp,
            ref_logp,
            advantages,
            mask,
            entropy,
            clip_eps=cfg.clip_eps,
            clip_eps_high=cfg.clip_eps_high,
            dual_clip=cfg.dual_clip,
            kl_type=cfg.kl_type,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
            agg=cfg.agg,
            guided_weight=guided_weight,
            guided=cfg.guided,
            guided_gamma=cfg.guided_gamma,
        )

    return fn
