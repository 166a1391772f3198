"""Released models' ``config.json`` values, so the planner and benchmarks need no download, and the
random-init model a run builds from its config's ``model.init`` fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roleagent_jax.models.config import Qwen2Config

_QWEN25_COMMON = dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=32768,
    use_sliding_window=False,
    bos_token_id=151643,
    eos_token_id=151645,
    torch_dtype="bfloat16",
)
BUILTIN_MODELS: dict[str, dict] = {
    "0.5b": dict(
        _QWEN25_COMMON,
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        _QWEN25_COMMON,
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        _QWEN25_COMMON,
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
    # SmolLM2-135M-Instruct: a Llama (no q/k/v biases), the one real model reachable offline here.
    "135m": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        attention_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    ),
}
MODEL_NAMES = {
    "0.5b": "Qwen2.5-0.5B-Instruct",
    "1.5b": "Qwen2.5-1.5B-Instruct",
    "7b": "Qwen2.5-7B-Instruct",
    "135m": "SmolLM2-135M-Instruct",
}


def init_config(
    init: Mapping[str, Any], vocab_size: int, eos_token_id: int | None = None, **settings: Any
) -> Qwen2Config:
    """The Qwen2 a run without a checkpoint builds at random: ``init`` (``config.model.init``, a
    config.json's fields) sized to its tokenizer. The trainer, the planner and the start-up checks all
    call this, so what they check and count is what the trainer builds. ``eos_token_id`` (the
    tokenizer's) replaces ``init``'s when given; ``settings`` are run-time ``Qwen2Config`` fields
    (dtypes, remat, scan_layers)."""
    fields = dict(init, vocab_size=vocab_size, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    if eos_token_id is not None:
        fields["eos_token_id"] = eos_token_id
    return Qwen2Config.from_hf(fields, **settings)
