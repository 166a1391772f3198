"""Hugging Face Llama checkpoints load into our model and are written back as Llama, against transformers."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from roleagent_jax.models import load_pretrained, save_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_llama_round_trip_matches_transformers(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    )
    ref = transformers.LlamaForCausalLM(config).eval()
    ref.save_pretrained(tmp_path / "ref")
    model, cfg = load_pretrained(tmp_path / "ref")
    assert (cfg.model_type, cfg.attention_bias, cfg.rope_theta) == ("llama", False, 100000.0)
    ids = [[5, 17, 3, 99, 42, 7, 64, 1]]
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids))), expected, atol=1e-5, rtol=0)

    save_pretrained(model, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"
    ]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert isinstance(back, transformers.LlamaForCausalLM)
    with torch.no_grad():
        np.testing.assert_allclose(back(torch.tensor(ids)).logits.numpy(), expected, atol=1e-5, rtol=0)


def test_smollm2_preset_counts_match_transformers():
    """The 135m preset has SmolLM2-135M's size, counted independently by transformers (meta tensors)."""
    import jax
    from flax import nnx

    from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM
    from roleagent_jax.models.presets import BUILTIN_MODELS

    hf = BUILTIN_MODELS["135m"]
    with torch.device("meta"):
        ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf))
    n_ref = sum(p.numel() for p in ref.parameters())
    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(Qwen2Config.from_hf(hf), rngs=nnx.Rngs(0)))
    n_ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert n_ours == n_ref == 134_515_008
