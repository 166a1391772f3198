"""policy_loss values and gradients against an independent PyTorch (float64 autograd) implementation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from roleagent_jax.rl.losses import LossConfig, policy_loss, reduce_metrics

CLIP, DUAL, KL_COEF, ENT_COEF = 0.2, 3.0, 0.05, 0.01


def torch_loss(logp, old, ref, adv, mask, ent, kl_type, agg, dual=DUAL):
    """The verl-style objective written directly in torch, float64."""
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    ratio = torch.exp(logp - old)
    surr = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
    if dual is not None:
        surr = torch.where(adv < 0, torch.minimum(surr, -adv * dual), surr)
    loss = surr - ENT_COEF * ent
    if kl_type == "kl":
        loss = loss + KL_COEF * (logp - ref)
    elif kl_type == "low_var_kl":
        d = ref - logp
        loss = loss + KL_COEF * torch.clamp(torch.exp(d) - d - 1, -10, 10)
    loss = loss * mask
    if agg == "token-mean":
        return loss.sum() / mask.sum()
    per_row = mask.sum(1)
    keep = per_row > 0
    return (loss.sum(1)[keep] / per_row[keep]).mean()


def make_case(per_token_adv: bool):
    rng = np.random.default_rng(5)
    b, t = 4, 8
    # Log-ratios chosen off the kinks: inside the clip range, above 1+eps, below 1-eps, above dual-clip.
    choices = np.array([0.05, -0.07, 0.5, -0.5, 1.5, 0.12])
    log_ratio = choices[rng.integers(0, len(choices), size=(b, t))]
    log_ratio[0, :6] = choices  # every branch is present at least once with each advantage sign below
    log_ratio[1, :6] = choices
    old = rng.normal(-2.0, 0.5, size=(b, t))
    logp = old + log_ratio
    ref = logp + rng.normal(0.0, 0.8, size=(b, t))
    ref[2, 3] = logp[2, 3] + 15.0  # k3 above its clamp of 10
    adv = np.array([1.3, -0.7, -2.0, 0.4])
    if per_token_adv:
        adv = adv[:, None] * (1.0 + rng.random((b, t)))
    mask = (rng.random((b, t)) > 0.2).astype(np.float64)
    mask[0, :6] = 1.0
    mask[1, :6] = 1.0
    mask[2, 3] = 1.0
    mask[3] = 0.0  # a row without response tokens
    ent = rng.uniform(0.1, 3.0, size=(b, t))
    return logp, old, ref, adv, mask, ent


def branches_present(logp, old, ref, adv, mask):
    a = np.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)
    r = np.exp(logp - old)
    live = mask > 0
    return {
        "unclipped": np.any(live & (r > 1 - CLIP) & (r < 1 + CLIP)),
        "clipped_high": np.any(live & (a > 0) & (r > 1 + CLIP)),
        "clipped_low": np.any(live & (a < 0) & (r < 1 - CLIP)),
        "dual_clip": np.any(live & (a < 0) & (r > DUAL)),
        "k3_clamped": np.any(live & (np.exp(ref - logp) - (ref - logp) - 1 > 10)),
    }


@pytest.mark.parametrize("kl_type", ["low_var_kl", "kl", "none"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_value_and_gradient_match_torch(kl_type, agg, per_token_adv):
    logp, old, ref, adv, mask, ent = make_case(per_token_adv)
    assert all(branches_present(logp, old, ref, adv, mask).values())

    def jax_objective(lp, entropy):
        num, den, _ = policy_loss(
            lp,
            jnp.asarray(old, jnp.float32),
            jnp.asarray(ref, jnp.float32),
            jnp.asarray(adv, jnp.float32),
            jnp.asarray(mask, jnp.float32),
            entropy,
            clip_eps=CLIP,
            dual_clip=DUAL,
            kl_type=kl_type,
            kl_coef=KL_COEF,
            entropy_coef=ENT_COEF,
            agg=agg,
        )
        return num / den

    value, (g_lp, g_ent) = jax.value_and_grad(jax_objective, argnums=(0, 1))(
        jnp.asarray(logp, jnp.float32), jnp.asarray(ent, jnp.float32)
    )

    t_lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    t_ent = torch.tensor(ent, dtype=torch.float64, requires_grad=True)
    t_val = torch_loss(
        t_lp, torch.tensor(old), torch.tensor(ref), torch.tensor(adv), torch.tensor(mask), t_ent, kl_type, agg
    )
    t_val.backward()
    np.testing.assert_allclose(float(value), t_val.item(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_lp), t_lp.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_ent), t_ent.grad.numpy(), rtol=1e-4, atol=1e-7)
    # Clipped branches carry no policy gradient; the dual-clip branch neither.
    g = np.asarray(g_lp)
    a = np.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)
    r = np.exp(logp - old)
    frozen = (mask > 0) & (((a > 0) & (r > 1 + CLIP)) | ((a < 0) & ((r < 1 - CLIP) | (r > DUAL))))
    if kl_type == "none":
        assert np.all(g[frozen] == 0.0)
        assert np.all(g[(mask > 0) & ~frozen] != 0.0)


def test_metrics_fractions():
    logp, old, ref, adv, mask, ent = make_case(False)
    _, _, sums = policy_loss(*(jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, mask, ent)))
    m = {k: float(v) for k, v in reduce_metrics(sums).items()}
    live = mask > 0
    a = np.broadcast_to(adv[:, None], logp.shape)
    r = np.exp(logp - old)
    clipped = ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8))
    assert m["tokens"] == live.sum()
    np.testing.assert_allclose(m["clip_frac"], clipped[live].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["dual_clip_frac"], ((a < 0) & (r > 3.0))[live].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["approx_kl"], (old - logp)[live].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["entropy"], ent[live].mean(), rtol=1e-5)
    d = np.clip(ref - logp, -20, 20)
    np.testing.assert_allclose(m["kl_ref"], np.clip(np.exp(d) - d - 1, -10, 10)[live].mean(), rtol=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_sums_equal_full_batch(agg):
    logp, old, ref, adv, mask, ent = (jnp.asarray(x, jnp.float32) for x in make_case(False))
    full_num, full_den, full_m = policy_loss(logp, old, ref, adv, mask, ent, agg=agg)
    parts = [slice(0, 1), slice(1, 3), slice(3, 4)]  # unequal splits; the last has no tokens
    outs = [policy_loss(logp[s], old[s], ref[s], adv[s], mask[s], ent[s], agg=agg) for s in parts]
    num = sum(o[0] for o in outs)
    den = sum(o[1] for o in outs)
    np.testing.assert_allclose(float(num / den), float(full_num / full_den), rtol=1e-6)
    for k in full_m:
        np.testing.assert_allclose(float(sum(o[2][k] for o in outs)), float(full_m[k]), rtol=1e-5, atol=1e-6)


def test_masked_garbage_does_not_leak():
    logp, old, ref, adv, mask, ent = make_case(False)
    junk_old = np.where(mask > 0, old, 1e30)
    a = policy_loss(*(jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, mask, ent)))
    b = policy_loss(*(jnp.asarray(x, jnp.float32) for x in (logp, junk_old, ref, adv, mask, ent)))
    assert float(a[0]) == float(b[0]) and np.isfinite(float(b[0]))


def test_config_validation():
    assert LossConfig.from_any({"kl_type": "kl"}).kl_type == "kl"
    with pytest.raises(ValueError, match="kl_type"):
        LossConfig(kl_type="k2")
    with pytest.raises(ValueError, match="agg"):
        LossConfig(agg="seq-sum")
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="unknown"):
        LossConfig.from_any({"clip": 0.1})
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(x, x, None, jnp.zeros(2), x)


def test_an_upper_clip_of_its_own_matches_an_asymmetric_reference():
    """clip_eps_high moves only the upper bound (positive advantages); 0 is the symmetric clip, and the
    low and high clip fractions count exactly the tokens each bound froze."""
    logp, old, ref, adv, mask, ent = make_case(False)
    args = [jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, mask, ent)]

    def objective(lp, **kw):
        num, den, sums = policy_loss(lp, *args[1:], clip_eps=CLIP, kl_type="none", entropy_coef=0.0, **kw)
        return num / den, sums

    r, a = np.exp(logp - old), np.broadcast_to(adv[:, None], logp.shape)
    live = mask > 0
    for high in (0.0, CLIP, 0.7):
        bound = high or CLIP
        surr = np.maximum(-a * r, -a * np.clip(r, 1 - CLIP, 1 + bound))
        surr = np.where(a < 0, np.minimum(surr, -a * DUAL), surr)
        expected = (surr * mask).sum() / mask.sum()
        (value, sums), grad = jax.value_and_grad(
            functools.partial(objective, clip_eps_high=high), has_aux=True
        )(args[0])
        np.testing.assert_allclose(float(value), expected, rtol=1e-5)
        m = {k: float(v) for k, v in reduce_metrics(sums).items()}
        low_hit, high_hit = (a < 0) & (r < 1 - CLIP), (a > 0) & (r > 1 + bound)
        np.testing.assert_allclose(m["clip_frac_low"], low_hit[live].mean(), rtol=1e-6)
        np.testing.assert_allclose(m["clip_frac_high"], high_hit[live].mean(), rtol=1e-6)
        np.testing.assert_allclose(m["clip_frac"], m["clip_frac_low"] + m["clip_frac_high"], rtol=1e-6)
        assert np.all(np.asarray(grad)[live & high_hit] == 0.0)
        if high == 0.7:  # log-ratio 0.5 (r = 1.65) now inside the clip: it carries gradient again
            assert np.any(np.asarray(grad)[live & (a > 0) & (r > 1 + CLIP) & (r < 1.7)] != 0.0)
    with pytest.raises(ValueError, match="clip_eps_high"):
        LossConfig(clip_eps_high=-0.1)


def test_rows_without_advantage_give_gradient_only_through_kl_and_entropy():
    """What leaving flat groups out changes: with no KL and entropy term their rows add nothing to the
    token-mean numerator, so dropping them only rescales the gradient by the token counts."""
    logp, old, ref, adv, mask, ent = make_case(False)
    adv = adv.copy()
    adv[1] = 0.0  # a row whose group had no spread
    kw = dict(clip_eps=CLIP, kl_type="none", entropy_coef=0.0)

    def grad(rows):
        def objective(lp):
            num, den, _ = policy_loss(
                lp, *(jnp.asarray(x[rows], jnp.float32) for x in (old, ref, adv, mask)), **kw
            )
            return num / den

        return np.asarray(jax.grad(objective)(jnp.asarray(logp[rows], jnp.float32)))

    every, kept = grad(np.arange(4)), grad(np.array([0, 2, 3]))
    assert np.all(every[1] == 0.0)
    tokens_all, tokens_kept = mask.sum(), mask[[0, 2, 3]].sum()
    np.testing.assert_allclose(kept, every[[0, 2, 3]] * tokens_all / tokens_kept, rtol=1e-5)
