"""Qwen2 NNX model behaviour: KV-cache decoding == full forward, remat/scan variants, dtype policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from qwen2_tiny import forward, left_padded_batch, max_diff_on_real, tiny_fields

from roleagent_jax.models import KVCache, Qwen2Config, Qwen2ForCausalLM, init_cache


def tiny_config(**kw) -> Qwen2Config:
    # attention_chunk 4: several (uneven) query chunks even at these short lengths.
    return Qwen2Config(**tiny_fields(**{"attention_chunk": 4, **kw}))


def random_model(cfg: Qwen2Config, seed: int = 0) -> Qwen2ForCausalLM:
    """Model with weights large enough that attention patterns matter (default init is near uniform)."""
    model = Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(seed))
    state = nnx.state(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    noisy = [
        (x + 0.1 * jax.random.normal(k, x.shape)).astype(x.dtype) if x.ndim else x
        for x, k in zip(leaves, keys)
    ]
    nnx.update(model, jax.tree.unflatten(treedef, noisy))
    return model


def test_default_positions_are_cumsum_of_mask():
    model = random_model(tiny_config())
    ids, mask, pos = left_padded_batch()
    implicit = forward(model, ids, mask)
    explicit = forward(model, ids, mask, jnp.asarray(pos))
    assert implicit.dtype == jnp.float32 and implicit.shape == (4, 9, 128)
    np.testing.assert_allclose(np.asarray(implicit), np.asarray(explicit), atol=1e-6)
    # A left-padded row gives the same logits as the same tokens unpadded.
    alone = forward(model, ids[1:2, 3:], mask[1:2, 3:])
    np.testing.assert_allclose(np.asarray(implicit)[1, 3:], np.asarray(alone)[0], atol=1e-5)


def test_chunked_causal_attention_matches_one_chunk():
    ids, mask, _ = left_padded_batch(seed=5)
    ref = random_model(tiny_config(attention_chunk=0))
    want = np.asarray(forward(ref, ids, mask))
    for chunk in (1, 4, 64):
        got = forward(
            copy_params(ref, Qwen2ForCausalLM(tiny_config(attention_chunk=chunk), rngs=nnx.Rngs(1))),
            ids,
            mask,
        )
        assert max_diff_on_real(got, want, mask) < 1e-5, chunk


@pytest.mark.parametrize("scan_layers,kv_heads", [(False, 2), (True, 4)])
def test_decode_token_by_token_matches_forward(scan_layers, kv_heads):
    cfg = tiny_config(num_key_value_heads=kv_heads, scan_layers=scan_layers)
    model = random_model(cfg)
    ids, mask, pos = left_padded_batch()
    full = np.asarray(forward(model, ids, mask))
    b, t = ids.shape
    slots = t + 3  # unused trailing slots must not matter
    cache = init_cache(cfg, b, slots)
    graphdef, params = nnx.split(model)

    @jax.jit
    def step(params, tok, p, cache, w, kv_mask):
        return nnx.merge(graphdef, params).decode(tok, p, cache, w, kv_mask)

    kv_mask = np.zeros((b, slots), bool)
    got = []
    for i in range(t):
        kv_mask[:, i] = mask[:, i].astype(bool)
        logits, cache = step(params, ids[:, i : i + 1], pos[:, i : i + 1], cache, jnp.int32(i), kv_mask)
        got.append(np.asarray(logits)[:, 0])
    layer_shape = (b, kv_heads, slots, cfg.head_dim)
    if scan_layers:
        assert isinstance(cache, KVCache) and cache.k.shape == (2, *layer_shape)
    else:
        assert isinstance(cache, KVCache) and [k.shape for k in cache.k] == [layer_shape] * 2
    assert max_diff_on_real(np.stack(got, 1), full, mask) < 1e-5


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("fresh", [False, True])
def test_prefill_then_single_steps_with_donated_cache(fresh, scan_layers):
    """A multi-token prefill (over the whole cache, or ``fresh`` over its own slots) then decode steps."""
    cfg = tiny_config(scan_layers=scan_layers)
    model = random_model(cfg, seed=3)
    ids, mask, pos = left_padded_batch(seed=1)
    full = np.asarray(forward(model, ids, mask))
    b, t = ids.shape
    graphdef, params = nnx.split(model)
    step = jax.jit(
        lambda params, tok, p, cache, w, m: nnx.merge(graphdef, params).decode(tok, p, cache, w, m),
        donate_argnums=(3,),
    )
    cache = init_cache(cfg, b, 16)
    kv_mask = np.zeros((b, 16), bool)
    n = 5
    kv_mask[:, :n] = mask[:, :n].astype(bool)
    prefill = jax.jit(
        lambda params, tok, p, cache, m: nnx.merge(graphdef, params).decode(tok, p, cache, 0, m, fresh=fresh)
    )
    logits, cache = prefill(params, ids[:, :n], pos[:, :n], cache, kv_mask)
    got = [np.asarray(logits)]
    # Then a 2-token step (the few-query attention path) and single-token steps.
    for i, j in [(n, n + 2)] + [(i, i + 1) for i in range(n + 2, t)]:
        kv_mask[:, i:j] = mask[:, i:j].astype(bool)
        logits, cache = step(params, ids[:, i:j], pos[:, i:j], cache, jnp.int32(i), kv_mask)
        got.append(np.asarray(logits))
    assert max_diff_on_real(np.concatenate(got, 1), full, mask) < 1e-5


def copy_params(src: Qwen2ForCausalLM, dst: Qwen2ForCausalLM) -> Qwen2ForCausalLM:
    """Give ``dst`` the weights of ``src``, stacking per-layer params when ``dst`` scans layers."""
    flat = {tuple(k): v[...] for k, v in nnx.to_flat_state(nnx.state(src))}
    layers = src.config.num_hidden_layers
    new = []
    for key, var in nnx.to_flat_state(nnx.state(dst)):
        if dst.config.scan_layers and key[0] == "layers":
            value = jnp.stack([flat[("layers", i, *key[1:])] for i in range(layers)])
        else:
            value = flat[tuple(key)]
        new.append((key, var.replace(value.astype(var[...].dtype))))
    nnx.update(dst, nnx.from_flat_state(new))
    return dst


def _loss_and_grads(model, ids, mask):
    graphdef, params = nnx.split(model)

    def loss(params):
        logits = nnx.merge(graphdef, params)(ids, mask)
        logp = jax.nn.log_softmax(logits[:, :-1])
        tok = jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
        return -(tok * mask[:, 1:]).sum() / mask[:, 1:].sum()

    return jax.jit(jax.value_and_grad(loss))(params)


def test_remat_and_scan_variants_match():
    ids, mask, _ = left_padded_batch(seed=2)
    base = random_model(tiny_config())
    ref_logits = np.asarray(forward(base, ids, mask))
    ref_loss, ref_grads = _loss_and_grads(base, ids, mask)
    ref_flat = {tuple(k): np.asarray(v[...]) for k, v in nnx.to_flat_state(ref_grads)}
    for overrides in ({"remat": True}, {"scan_layers": True, "remat": True}):
        variant = copy_params(base, Qwen2ForCausalLM(tiny_config(**overrides), rngs=nnx.Rngs(5)))
        np.testing.assert_allclose(np.asarray(forward(variant, ids, mask)), ref_logits, atol=1e-5)
        loss, grads = _loss_and_grads(variant, ids, mask)
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
        for key, g in nnx.to_flat_state(grads):
            g = np.asarray(g[...])
            if overrides.get("scan_layers") and key[0] == "layers":
                want = np.stack([ref_flat[("layers", i, *key[1:])] for i in range(2)])
            else:
                want = ref_flat[tuple(key)]
            np.testing.assert_allclose(g, want, atol=1e-5, err_msg=str(key))


def test_bfloat16_policy_keeps_float32_logits():
    ids, mask, _ = left_padded_batch()
    f32 = random_model(tiny_config())
    bf16 = Qwen2ForCausalLM(tiny_config(param_dtype="bfloat16", dtype="bfloat16"), rngs=nnx.Rngs(0))
    copy_params(f32, bf16)
    assert all(v[...].dtype == jnp.bfloat16 for _, v in nnx.to_flat_state(nnx.state(bf16)))
    out = forward(bf16, ids, mask)
    assert out.dtype == jnp.float32
    assert max_diff_on_real(out, forward(f32, ids, mask), mask) < 0.1
    mixed = Qwen2ForCausalLM(tiny_config(param_dtype="float32", dtype="bfloat16"), rngs=nnx.Rngs(0))
    copy_params(f32, mixed)
    assert forward(mixed, ids, mask).dtype == jnp.float32
    assert init_cache(mixed.config, 2, 4).k[0].dtype == jnp.bfloat16


def test_bfloat16_trains_on_cpu_at_a_batch_xla_leaves_unfused():
    """At this size XLA:CPU leaves the bf16 logits and chunked-attention dots unfused, where it has no
    bf16 x bf16 -> f32 kernel (UNIMPLEMENTED when run): the forward and its gradient must still run and
    agree with float32 to bf16 precision."""
    cfg = tiny_config(attention_chunk=64)
    f32 = random_model(cfg)
    bf16 = Qwen2ForCausalLM(cfg.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
    copy_params(f32, bf16)
    ids = jnp.asarray(np.random.default_rng(0).integers(1, cfg.vocab_size, (8, 256)), jnp.int32)
    graphdef, params = nnx.split(bf16)
    logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, ids)
    reference = jax.jit(lambda m, x: m(x))(f32, ids)
    assert logits.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(logits - reference))) < 0.1 * float(jnp.max(jnp.abs(reference)))
    grads = jax.jit(jax.grad(lambda p, x: nnx.merge(graphdef, p)(x).mean()))(params, ids)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_config_rejects_inconsistent_heads():
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        tiny_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="unsupported dtype"):
        tiny_config(dtype="float8")
