"""Weights and hyper-parameters of a llama.cpp GGUF file, as a Hugging Face checkpoint's tensors.

The file is read with the ``gguf`` library (ggml's own reader and dequantizers), never parsed by hand.
Every tensor becomes float32 under its Hugging Face name. llama.cpp stores a Llama's q/k rows permuted
for its interleaved rope layout; that permutation is undone here so the rows match the half-split
rotary layout of transformers (and ours). Qwen2 files are stored unpermuted.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from roleagent_jax.models.config import Qwen2Config

ARCHITECTURES = ("llama", "qwen2")
TENSOR_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


class GGUFError(ValueError):
    """A GGUF file this importer cannot turn into a checkpoint; the message names the file."""


@dataclasses.dataclass
class GGUFModel:
    """What a GGUF file holds, in Hugging Face terms."""

    config: Qwen2Config
    tensors: dict[str, np.ndarray]  # Hugging Face name -> float32 array
    metadata: dict[str, Any]  # every key/value field (arrays as lists)


def check_gguf_path(path: Path) -> None:
    """GGUFError naming `path` when it is no file to read (absent, or a folder)."""
    if path.is_dir():
        raise GGUFError(f"{path}: is a folder, not a GGUF file")
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")


def open_reader(path: str | os.PathLike):
    """A ``GGUFReader`` on the file; a missing, truncated or corrupt file raises GGUFError naming it."""
    from gguf import GGUFReader

    path = Path(path)
    check_gguf_path(path)
    try:
        return GGUFReader(path)
    except Exception as err:  # the reader raises ValueError, IndexError, struct errors... on bad bytes
        raise GGUFError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from None


def read_metadata(reader) -> dict[str, Any]:
    """Every key/value field of the file, decoded (strings, numbers, lists)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's ``reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`` of q/k rows."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _config(path: Path, meta: dict[str, Any], arch: str, tied: bool) -> Qwen2Config:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"{path}: metadata key {arch}.{key} is missing")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise GGUFError(f"{path}: rope scaling {scaling!r} is not supported (only unscaled rope)")
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    if not vocab:
        raise GGUFError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    try:
        return Qwen2Config(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(get("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            tie_word_embeddings=tied,
            attention_bias=arch == "qwen2",
            max_position_embeddings=int(get("context_length")),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=eos,
            model_type=arch,
        )
    except ValueError as err:
        raise GGUFError(f"{path}: inconsistent hyper-parameters ({err})") from None


def _hf_name(path: Path, name: str, n_layers: int) -> str:
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        if int(parts[1]) >= n_layers:
            raise GGUFError(f"{path}: tensor {name} is beyond block_count {n_layers}")
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}"
    raise GGUFError(f"{path}: tensor {name!r} is not part of a supported Llama/Qwen2 model")


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Hyper-parameters and float32 tensors (Hugging Face names and layout) of a Llama or Qwen2 GGUF.

    Raises GGUFError naming the file for an unsupported architecture or tensor type, a missing or
    misshapen tensor, or bytes the reader cannot decode.
    """
    from gguf import quants

    path = Path(path)
    reader = open_reader(path)
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported (only {', '.join(ARCHITECTURES)})")
    names = {t.name for t in reader.tensors}
    cfg = _config(path, meta, arch, tied="output.weight" not in names)
    shapes = _declared_shapes(path, cfg, reader.tensors)
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        hf = _hf_name(path, t.name, cfg.num_hidden_layers)
        shape = shapes[hf]
        try:
            w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        except Exception as err:
            raise GGUFError(
                f"{path}: tensor {t.name} ({t.tensor_type.name}) cannot be decoded ({err})"
            ) from None
        if arch == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = cfg.num_attention_heads if "attn_q" in t.name else cfg.num_key_value_heads
            w = _unpermute(w, heads)
        tensors[hf] = w
    return GGUFModel(cfg, tensors, meta)


def _declared_shapes(path: Path, cfg: Qwen2Config, infos) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every tensor the file really holds (from its tensor headers, nothing
    decoded), checked against the metadata first: a header that declares more layers, a wider model or
    a larger vocabulary than the file's tensors is refused before anything of that size is allocated."""
    blocks = {
        int(t.name.split(".")[1])
        for t in infos
        if t.name.startswith("blk.") and t.name.split(".")[1].isdigit()
    }
    if cfg.num_hidden_layers != len(blocks):
        raise GGUFError(
            f"{path}: metadata declares block_count={cfg.num_hidden_layers}, but the file holds tensors of "
            f"{len(blocks)} block(s)"
        )
    shapes = {}
    for t in infos:
        kind = t.tensor_type.name
        if kind not in TENSOR_TYPES:
            raise GGUFError(
                f"{path}: tensor {t.name} has type {kind}, not supported ({', '.join(TENSOR_TYPES)})"
            )
        # ggml lists dimensions innermost first
        shapes[_hf_name(path, t.name, cfg.num_hidden_layers)] = tuple(int(d) for d in reversed(t.shape))
    _check_shapes(path, cfg, shapes)
    return shapes


def expected_shapes(cfg: Qwen2Config) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape for a model of this config."""
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        }
        if cfg.attention_bias:
            out |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,)}
            out[p + "self_attn.v_proj.bias"] = (kv,)
    return out


def _check_shapes(path: Path, cfg: Qwen2Config, shapes: dict[str, tuple[int, ...]]) -> None:
    want = expected_shapes(cfg)
    for name, shape in want.items():
        if name not in shapes:
            raise GGUFError(f"{path}: tensor for {name} is missing")
        if shapes[name] != shape:
            raise GGUFError(f"{path}: {name} has shape {shapes[name]}, the metadata implies {shape}")
    extra = sorted(set(shapes) - set(want))
    if extra:
        raise GGUFError(f"{path}: unexpected tensor {extra[0]} for a {cfg.model_type} model")
