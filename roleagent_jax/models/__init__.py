"""Qwen2 decoder in Flax NNX and its Hugging Face checkpoint I/O."""

from roleagent_jax.models.config import Qwen2Config
from roleagent_jax.models.hf_io import load_pretrained, save_pretrained
from roleagent_jax.models.presets import BUILTIN_MODELS, MODEL_NAMES, init_config
from roleagent_jax.models.qwen2 import KVCache, Qwen2ForCausalLM, SharedPrefix, init_cache

__all__ = [
    "BUILTIN_MODELS",
    "MODEL_NAMES",
    "KVCache",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "SharedPrefix",
    "init_cache",
    "init_config",
    "load_pretrained",
    "save_pretrained",
]
