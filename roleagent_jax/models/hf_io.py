"""Hugging Face Qwen2 checkpoints (safetensors only) to and from our NNX model.

Loading builds the model abstractly and places each tensor straight onto its target sharding, so no
device ever holds the whole model. The safetensors format is read and written here directly (a JSON
header plus raw little-endian buffers), which also covers bfloat16 without going through torch.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from roleagent_jax.models.config import Qwen2Config
from roleagent_jax.models.qwen2 import Qwen2ForCausalLM

_ST_TO_NP = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_NP_TO_ST = {np.dtype(v): k for k, v in _ST_TO_NP.items()}

# Block-relative path of our param -> (HF name inside "model.layers.{i}.", number of input axes).
# Kernels map as ``ours = hf.T.reshape(shape)``; the input axes count says how to flatten back; 0 means
# a flattened vector (biases ``[heads, head_dim]``, norms) and -1 the same layout (the embedding table).
_BLOCK_NAMES = {
    "attn/q_proj/kernel": ("self_attn.q_proj.weight", 1),
    "attn/k_proj/kernel": ("self_attn.k_proj.weight", 1),
    "attn/v_proj/kernel": ("self_attn.v_proj.weight", 1),
    "attn/o_proj/kernel": ("self_attn.o_proj.weight", 2),
    "attn/q_proj/bias": ("self_attn.q_proj.bias", 0),
    "attn/k_proj/bias": ("self_attn.k_proj.bias", 0),
    "attn/v_proj/bias": ("self_attn.v_proj.bias", 0),
    "mlp/gate_proj/kernel": ("mlp.gate_proj.weight", 1),
    "mlp/up_proj/kernel": ("mlp.up_proj.weight", 1),
    "mlp/down_proj/kernel": ("mlp.down_proj.weight", 1),
    "input_norm/scale": ("input_layernorm.weight", 0),
    "post_attn_norm/scale": ("post_attention_layernorm.weight", 0),
}
_TOP_NAMES = {
    "embed/embedding": ("model.embed_tokens.weight", -1),
    "final_norm/scale": ("model.norm.weight", 0),
    "lm_head/kernel": ("lm_head.weight", 1),
}


# -- safetensors ---------------------------------------------------------------------------------------
class _SafetensorsFile:
    """Lazy reader: tensors are memory-mapped views, read when converted."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(size))
        self.header.pop("__metadata__", None)
        self.base = 8 + size

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in _ST_TO_NP:
            raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        dtype = np.dtype(_ST_TO_NP[info["dtype"]])
        count = (end - start) // dtype.itemsize
        if count == 0:
            return np.zeros(info["shape"], dtype)
        mm = np.memmap(self.path, dtype=dtype, mode="r", offset=self.base + start, shape=(count,))
        return mm.reshape(info["shape"])

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])


class _Checkpoint:
    """All tensors of a checkpoint directory (single file or index + shards) by name."""

    def __init__(self, directory: Path):
        index = directory / "model.safetensors.index.json"
        single = directory / "model.safetensors"
        self.files: dict[str, _SafetensorsFile] = {}
        self.where: dict[str, str] = {}
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            for name, fname in weight_map.items():
                if fname not in self.files:
                    shard = directory / fname
                    if not shard.is_file():
                        raise FileNotFoundError(f"shard {shard} listed in {index} is missing")
                    self.files[fname] = _SafetensorsFile(shard)
                self.where[name] = fname
        elif single.is_file():
            self.files["model.safetensors"] = _SafetensorsFile(single)
            self.where = {n: "model.safetensors" for n in self.files["model.safetensors"].header}
        else:
            others = sorted(p.name for p in directory.glob("*.bin")) + sorted(
                p.name for p in directory.glob("*.pt*")
            )
            hint = f" (found {others}: only safetensors are supported, convert them first)" if others else ""
            raise FileNotFoundError(
                f"no model.safetensors or model.safetensors.index.json in {directory}{hint}"
            )

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> np.ndarray:
        return self.files[self.where[name]].get(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.files[self.where[name]].shape(name)


def _write_safetensors(path: Path, tensors: dict[str, tuple[tuple[int, ...], np.dtype]], fetch) -> None:
    """Write tensors one at a time: the header comes from shapes/dtypes, ``fetch(name)`` gives data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in tensors.items():
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": _NP_TO_ST[np.dtype(dtype)],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, (shape, dtype) in tensors.items():
            arr = np.ascontiguousarray(fetch(name), dtype=dtype)
            if arr.shape != tuple(shape):
                raise ValueError(f"tensor {name}: expected shape {tuple(shape)}, got {arr.shape}")
            f.write(arr.tobytes())
    os.replace(tmp, path)


# -- name / layout mapping -----------------------------------------------------------------------------
def _flat_params(state: nnx.State) -> dict[tuple, Any]:
    return {tuple(k): v for k, v in nnx.to_flat_state(state)}


def _mapping(path: tuple, cfg: Qwen2Config) -> list[tuple[str, int, int | None]]:
    """HF names for one of our params: ``[(name, input_axes, layer_or_None)]`` (one per layer if stacked)."""
    parts = [str(p) for p in path]
    if parts[0] == "layers":
        if cfg.scan_layers:
            rel = "/".join(parts[1:])
            layers = list(range(cfg.num_hidden_layers))
        else:
            rel = "/".join(parts[2:])
            layers = [int(parts[1])]
        if rel not in _BLOCK_NAMES:
            raise ValueError(f"parameter {'/'.join(parts)} has no Hugging Face name")
        name, n_in = _BLOCK_NAMES[rel]
        return [(f"model.layers.{i}.{name}", n_in, i) for i in layers]
    rel = "/".join(parts)
    if rel not in _TOP_NAMES:
        raise ValueError(f"parameter {rel} has no Hugging Face name")
    name, n_in = _TOP_NAMES[rel]
    return [(name, n_in, None)]


def _hf_shape(shape: tuple[int, ...], n_in: int) -> tuple[int, ...]:
    if n_in < 0:
        return shape
    if n_in == 0:
        return (math.prod(shape),)
    return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


def _to_ours(hf: np.ndarray, shape: tuple[int, ...], n_in: int) -> np.ndarray:
    return (hf.T if n_in > 0 else hf).reshape(shape)


def _to_hf(ours: np.ndarray, n_in: int) -> np.ndarray:
    if n_in < 0:
        return ours
    if n_in == 0:
        return ours.reshape(-1)
    return ours.reshape(math.prod(ours.shape[:n_in]), -1).T


# -- public API ----------------------------------------------------------------------------------------
def load_pretrained(
    path: str | os.PathLike,
    mesh: jax.sharding.Mesh | None = None,
    dtype: str | None = None,
    **config_overrides,
) -> tuple[Qwen2ForCausalLM, Qwen2Config]:
    """Read a Hugging Face Qwen2 directory into our model, each tensor placed on its sharding.

    ``dtype`` (e.g. "bfloat16") sets both the parameter and the compute dtype; ``config_overrides``
    set any other :class:`Qwen2Config` field (``remat``, ``scan_layers``, ``param_dtype``...).
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    if dtype is not None:
        config_overrides = {"param_dtype": dtype, "dtype": dtype, **config_overrides}
    cfg = Qwen2Config.from_hf(directory, **config_overrides)
    ckpt = _Checkpoint(directory)

    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    if mesh is not None:
        from roleagent_jax.sharding import param_shardings

        shardings = _flat_params(param_shardings(abs_state, mesh))
    else:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = None

    # Check every name and shape before placing anything, so a bad checkpoint fails fast.
    plan = {}
    for key, var in _flat_params(abs_state).items():
        shape = tuple(var.get_value().shape)
        per_layer_shape = shape[1:] if cfg.scan_layers and key[0] == "layers" else shape
        for name, n_in, _ in _mapping(key, cfg):
            if name not in ckpt:
                raise ValueError(f"tensor {name} is missing from the checkpoint in {directory}")
            expected = _hf_shape(per_layer_shape, n_in)
            if ckpt.shape(name) != expected:
                raise ValueError(
                    f"tensor {name} has shape {ckpt.shape(name)} in the checkpoint but the config implies {expected}"
                )
        plan[key] = (shape, per_layer_shape, var.get_value().dtype)

    loaded = {}
    for key, (shape, per_layer_shape, target_dtype) in plan.items():
        pieces = [
            _to_ours(np.asarray(ckpt.get(name)), per_layer_shape, n_in).astype(target_dtype)
            for name, n_in, _ in _mapping(key, cfg)
        ]
        host = np.stack(pieces) if shape != per_layer_shape else pieces[0]
        if shardings is None:
            loaded[key] = jax.device_put(host, device)
        else:  # each device (of every process) copies only its own slice of the host tensor
            loaded[key] = jax.make_array_from_callback(
                host.shape, shardings[key].get_value(), lambda index, host=host: host[index]
            )
        del pieces, host

    state = nnx.from_flat_state({k: v.replace(loaded[k]) for k, v in _flat_params(abs_state).items()})
    return nnx.merge(graphdef, state), cfg


def _host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_pretrained(model: Qwen2ForCausalLM, path: str | os.PathLike, tokenizer: Any = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers`` loads as Qwen2ForCausalLM.

    Tensors are fetched and written one at a time, so the host never holds a second copy of the model.
    In a multi-process run every process must call this (arrays are gathered); only process 0 writes.
    """
    cfg = model.config
    directory = Path(path)
    params = _flat_params(nnx.state(model, nnx.Param))
    entries: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    sources: dict[str, tuple[tuple, int, int | None]] = {}
    for key, var in params.items():
        shape = tuple(var.get_value().shape)
        per_layer_shape = shape[1:] if cfg.scan_layers and key[0] == "layers" else shape
        for name, n_in, layer in _mapping(key, cfg):
            entries[name] = (_hf_shape(per_layer_shape, n_in), np.dtype(var.get_value().dtype))
            sources[name] = (key, n_in, layer)
    if not cfg.attention_bias:  # transformers' Qwen2 always has q/k/v biases: write them as zeros
        for i in range(cfg.num_hidden_layers):
            for proj, heads in (
                ("q", cfg.num_attention_heads),
                ("k", cfg.num_key_value_heads),
                ("v", cfg.num_key_value_heads),
            ):
                entries[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = (
                    (heads * cfg.head_dim,),
                    np.dtype(cfg.param_dtype),
                )

    def fetch(name: str) -> np.ndarray:
        if name not in sources:
            return np.zeros(entries[name][0], entries[name][1])
        key, n_in, layer = sources[name]
        value = params[key].get_value()
        return _to_hf(_host(value if layer is None or not cfg.scan_layers else value[layer]), n_in)

    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
        _write_safetensors(directory / "model.safetensors", entries, fetch)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))
    else:
        for name in entries:
            fetch(name)  # take part in the collective gathers
