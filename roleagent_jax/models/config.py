"""Qwen2 / Llama hyper-parameters, read from and written to Hugging Face ``config.json``.

Llama is Qwen2 without the q/k/v biases (same weight names, same block), so one model serves both;
``model_type`` only decides which ``config.json`` is written back, so transformers reads a saved model
as the class it came from.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

_SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")


# config.json fields we read, by kind: (name, required). Sizes must be positive integers.
_SIZE_FIELDS = (
    ("vocab_size", True),
    ("hidden_size", True),
    ("intermediate_size", True),
    ("num_hidden_layers", True),
    ("num_attention_heads", True),
    ("num_key_value_heads", False),
    ("max_position_embeddings", False),
)
_POSITIVE_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps")
_BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "use_sliding_window", "mlp_bias")
# model_type -> (architecture class name, whether q/k/v carry biases when config.json does not say).
MODEL_TYPES = {"qwen2": ("Qwen2ForCausalLM", True), "llama": ("LlamaForCausalLM", False)}


def _check_fields(cfg: dict) -> None:
    """Raise ValueError naming the first missing or mistyped field (before any arithmetic uses it)."""
    for name, required in _SIZE_FIELDS:
        value = cfg.get(name)
        if value is None:
            if required:
                raise ValueError(f"field {name!r} is missing")
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"field {name!r} must be a positive integer, got {value!r}")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 0):
        raise ValueError(f"field 'head_dim' must be a positive integer, got {head_dim!r}")
    for name in _POSITIVE_FLOAT_FIELDS:
        value = cfg.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise ValueError(f"field {name!r} must be a positive number, got {value!r}")
    for name in _BOOL_FIELDS:
        value = cfg.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"field {name!r} must be true or false, got {value!r}")
    for name in ("bos_token_id", "eos_token_id"):
        value = cfg.get(name)
        ids = value if isinstance(value, list) else [value]
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"field {name!r} must be a token id or a list of them, got {value!r}")
    for name in ("rope_parameters", "rope_scaling"):
        if cfg.get(name) is not None and not isinstance(cfg[name], dict):
            raise ValueError(f"field {name!r} must be an object, got {cfg[name]!r}")


def _read_config_json(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _dtype_name(value: Any) -> str:
    name = str(value).removeprefix("torch.")
    if name not in _SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {value!r}: use one of {_SUPPORTED_DTYPES}")
    return name


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Architecture sizes plus our run-time policy (dtypes, remat, layer scan).

    ``param_dtype`` is the storage dtype of the weights, ``dtype`` the compute dtype of activations;
    logits are always returned in float32 so losses and sampling see full precision.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: bool = False
    scan_layers: bool = False
    attention_chunk: int = 64  # query rows per causal-attention chunk in the full forward (0 = one chunk)
    model_type: str = "qwen2"  # "qwen2" or "llama": the config.json written back (see MODEL_TYPES)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads}: give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported: use one of {sorted(MODEL_TYPES)}"
            )
        object.__setattr__(self, "param_dtype", _dtype_name(self.param_dtype))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        if isinstance(self.eos_token_id, (list, tuple)):
            # A tuple keeps the frozen config hashable (it is static metadata of the NNX graph).
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def matmul_weights(self) -> int:
        """Weights a token is multiplied through (attention and MLP projections of every layer, and the
        LM head): what a prefilled position costs is in proportion to it."""
        h, hd = self.hidden_size, self.head_dim
        attention = h * hd * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        return self.num_hidden_layers * (attention + 3 * h * self.intermediate_size) + self.vocab_size * h

    def replace(self, **changes: Any) -> Qwen2Config:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, cfg: dict | str | os.PathLike, **overrides: Any) -> Qwen2Config:
        """Build from a ``config.json`` dict, the file itself, or the checkpoint directory holding it.

        A bad file raises ValueError naming the file and the field.
        """
        if isinstance(cfg, dict):
            return cls._from_dict(cfg, overrides)
        path = Path(cfg)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no Hugging Face config at {path}: pass a checkpoint directory")
        try:
            return cls._from_dict(_read_config_json(path), overrides)
        except ValueError as err:
            message = str(err)
            raise ValueError(message if message.startswith(str(path)) else f"{path}: {message}") from None

    @classmethod
    def _from_dict(cls, cfg: dict, overrides: dict) -> Qwen2Config:
        _check_fields(cfg)
        model_type = cfg.get("model_type") or "qwen2"
        archs = cfg.get("architectures") or []
        if model_type not in MODEL_TYPES or any(a != MODEL_TYPES[model_type][0] for a in archs):
            raise ValueError(
                "expected a Qwen2 or Llama checkpoint (model_type 'qwen2' / 'llama', architectures "
                f"['Qwen2ForCausalLM'] / ['LlamaForCausalLM']), got model_type={model_type!r}, "
                f"architectures={archs!r}"
            )
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported; set use_sliding_window false")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias true is not supported (Llama's MLP has no biases by default)")
        if model_type == "llama" and cfg.get("attention_bias"):
            raise ValueError("attention_bias true is not supported for Llama (it adds an o_proj bias)")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"rope_type {rope_type!r} is not supported (only 'default'; Llama-3.1's 'llama3' "
                "frequency scaling is not implemented)"
            )
        theta = rope.get("rope_theta", cfg.get("rope_theta", 1e6))
        kwargs: dict[str, Any] = dict(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim") or 0,
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", MODEL_TYPES[model_type][1])),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
            model_type=model_type,
        )
        stored = cfg.get("dtype") or cfg.get("torch_dtype")
        if stored in _SUPPORTED_DTYPES:
            kwargs["param_dtype"] = stored
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown Qwen2Config fields in overrides: {sorted(unknown)}")
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf(self) -> dict:
        """The ``config.json`` content that ``transformers`` reads as this ``model_type``'s class."""
        out = {
            "architectures": [MODEL_TYPES[self.model_type][0]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id)
            if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            "dtype": self.param_dtype,
            "torch_dtype": self.param_dtype,
        }
        if self.model_type == "llama":
            del out["use_sliding_window"]
            out.update(attention_bias=False, mlp_bias=False)
        return out
