"""Hugging Face Qwen2 and Llama checkpoints (safetensors only) to and from our NNX model.

Loading builds the model abstractly and places each tensor straight onto its target sharding: every
device's block is read from the file on its own (``safetensors.safe_open`` slices), so no device and no
host ever holds more of a tensor than it needs. The ``safetensors`` library checks each file's header
(bounds, offsets inside the file, shape x dtype = byte length) when it is opened; a bad file raises a
ValueError that names it. Parameters are kept in ``param_dtype`` (float32 by default) whatever dtype
the checkpoint was stored in: RL updates at lr 1e-6 vanish in bfloat16 weights.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from roleagent_jax.models.config import Qwen2Config
from roleagent_jax.models.lora import has_lora, merged
from roleagent_jax.models.qwen2 import Qwen2ForCausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 2 * 2**30  # a larger model is written as several files (the host holds one at a time)

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
def umask_mode(path: str | os.PathLike) -> None:
    """Give a file or folder the mode a new one of this process gets (0666 or 0777 less the umask):
    ``safetensors`` writes owner-only (0600) files and ``mkdtemp`` owner-only folders, which other users
    of a shared folder could then not read."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~mask)


def save_tensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """``safetensors`` ``save_file`` (PyTorch's metadata), readable as the folder's other files are."""
    save_file(tensors, path, metadata={"format": "pt"})
    umask_mode(path)


def _open(path: Path):
    """A lazy reader of one safetensors file; a file that is not one raises ValueError naming it."""
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: empty file (0 bytes), not a safetensors file")
    try:
        return safe_open(path, framework="numpy")
    except SafetensorError as err:
        raise ValueError(f"{path}: not a valid safetensors file ({err})") from None


class _Checkpoint:
    """All tensors of a checkpoint directory (single file or index + shards) by name, read lazily."""

    def __init__(self, directory: Path):
        self.directory = directory
        index = directory / INDEX_FILE
        single = directory / SINGLE_FILE
        self.files: dict[str, Any] = {}  # file name -> reader
        self.where: dict[str, str] = {}  # tensor name -> file name
        if index.is_file():
            held: dict[str, set[str]] = {}
            for name, fname in _weight_map(index).items():
                if fname not in self.files:
                    shard = directory / fname
                    if not shard.is_file():
                        raise FileNotFoundError(f"shard {shard} listed in {index} is missing")
                    self.files[fname] = _open(shard)
                    held[fname] = set(self.files[fname].keys())
                if name not in held[fname]:
                    raise ValueError(f"{directory / fname}: tensor {name} listed in {index} is not in it")
                self.where[name] = fname
        elif single.is_file():
            self.files[SINGLE_FILE] = _open(single)
            self.where = {n: SINGLE_FILE for n in self.files[SINGLE_FILE].keys()}
        else:
            others = sorted(p.name for p in directory.glob("*.bin")) + sorted(
                p.name for p in directory.glob("*.pt*")
            )
            hint = f" (found {others}: only safetensors are supported, convert them first)" if others else ""
            raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {directory}{hint}")

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.files[self.where[name]].get_slice(name).get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The block ``index`` of tensor ``name``: only those bytes are read."""
        try:
            return np.asarray(self.files[self.where[name]].get_slice(name)[index])
        except (SafetensorError, TypeError, ValueError) as err:
            raise ValueError(
                f"{self.directory / self.where[name]}: cannot read tensor {name} ({err})"
            ) from None


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ValueError(f"{index}: not a valid index ({err})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(f"{index}: 'weight_map' must map tensor names to file names")
    return weight_map


def _write_safetensors(directory: Path, tensors: dict[str, tuple[tuple[int, ...], np.dtype]], fetch) -> None:
    """Write the tensors as ``model.safetensors``, or as shards of at most MAX_SHARD_BYTES plus an index.

    ``fetch(name)`` gives one tensor; the host holds one shard at a time. Each file is written under a
    temporary name and renamed, and files of an earlier save that this one does not use are removed, so
    a reader never sees a mixture. ``fetch`` is called for every tensor in order on every process.
    """
    shards: list[list[str]] = [[]]
    size = 0
    for name, (shape, dtype) in tensors.items():
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    writer = jax.process_index() == 0
    if writer and len(names) == 1:  # an index left by an earlier sharded save would shadow the new file
        (directory / INDEX_FILE).unlink(missing_ok=True)
    for fname, shard in zip(names, shards, strict=True):
        arrays = {}
        for name in shard:
            shape, dtype = tensors[name]
            arr = np.ascontiguousarray(fetch(name), dtype=dtype)
            if arr.shape != tuple(shape):
                raise ValueError(f"tensor {name}: expected shape {tuple(shape)}, got {arr.shape}")
            arrays[name] = arr
        if writer:
            tmp = directory / (fname + ".tmp")
            save_tensors(arrays, tmp)
            os.replace(tmp, directory / fname)
        del arrays
    if not writer:
        return
    if len(names) > 1:
        total = sum(math.prod(s) * np.dtype(d).itemsize for s, d in tensors.values())
        weight_map = {name: fname for fname, shard in zip(names, shards, strict=True) for name in shard}
        tmp = directory / (INDEX_FILE + ".tmp")
        tmp.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        os.replace(tmp, directory / INDEX_FILE)
    for stale in directory.glob("model*.safetensors"):
        if stale.name not in names:
            stale.unlink()


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


def _read_block(
    ckpt: _Checkpoint, name: str, shape: tuple[int, ...], n_in: int, index: tuple[slice, ...]
) -> np.ndarray:
    """The block ``index`` (one slice per axis) of our parameter of ``shape`` stored as HF tensor ``name``.

    Our kernels are ``hf.T.reshape(shape)``: the leading ``n_in`` axes flatten into the HF columns, the
    others into its rows, so a slice of each group's first axis is a contiguous range of columns/rows.
    Only that range is read; later axes of a group are then sliced in memory.
    """
    index = tuple(slice(*s.indices(d)) for s, d in zip(index, shape, strict=True))
    if any(s.step != 1 for s in index):
        raise ValueError(f"strided shard of {name} is not supported: {index}")
    if n_in < 0:  # same layout
        return ckpt.read(name, index)
    groups = [(0, n_in), (n_in, len(shape))] if n_in > 0 else [(0, len(shape))]
    ranges, block_shape, rest = [], [], []
    for lo, hi in groups:
        first, inner = index[lo], math.prod(shape[lo + 1 : hi])
        ranges.append(slice(first.start * inner, first.stop * inner))
        block_shape += [first.stop - first.start, *shape[lo + 1 : hi]]
        rest += [slice(None), *index[lo + 1 : hi]]
    if n_in > 0:  # HF rows are our output axes, its columns our input axes
        block = ckpt.read(name, (ranges[1], ranges[0])).T
    else:
        block = ckpt.read(name, (ranges[0],))
    return block.reshape(block_shape)[tuple(rest)]


def _to_hf(ours: np.ndarray, n_in: int) -> np.ndarray:
    if n_in < 0:
        return ours
    if n_in == 0:
        return ours.reshape(-1)
    return ours.reshape(math.prod(ours.shape[:n_in]), -1).T


def _block_reader(ckpt: _Checkpoint, names: list, shape: tuple, per_layer_shape: tuple, dtype):
    """``index -> block`` of one parameter in ``dtype``, for ``jax.make_array_from_callback``.

    Replicated shardings ask every device for the same block: each distinct block is read once.
    """
    blocks: dict[tuple, np.ndarray] = {}

    def block(index) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        memo = tuple((s.start, s.stop, s.step) for s in index)
        if memo not in blocks:
            if shape != per_layer_shape:  # a scanned stack: one HF tensor per layer
                layers = range(*index[0].indices(len(names)))
                pieces = [
                    _read_block(ckpt, names[i][0], per_layer_shape, names[i][1], index[1:]) for i in layers
                ]
                blocks[memo] = np.stack(pieces).astype(dtype)
            else:
                blocks[memo] = _read_block(ckpt, names[0][0], per_layer_shape, names[0][1], index).astype(
                    dtype
                )
        return blocks[memo]

    return block


# -- public API ----------------------------------------------------------------------------------------
def _open_checked(path: str | os.PathLike, overrides: dict):
    """Config, reader, abstract model and the per-parameter plan of a checkpoint directory, with every
    file header, tensor name and shape checked (nothing is read beyond the headers)."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    cfg = Qwen2Config.from_hf(directory, **overrides)
    ckpt = _Checkpoint(directory)
    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
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
                    f"tensor {name} has shape {ckpt.shape(name)} in the checkpoint in {directory} but the "
                    f"config implies {expected}"
                )
        plan[key] = (shape, per_layer_shape, var.get_value().dtype)
    bias = "model.layers.0.self_attn.q_proj.bias"
    if cfg.model_type == "llama" and bias in ckpt:
        raise ValueError(
            f"tensor {bias} is in the checkpoint in {directory} but its config has no attention bias"
        )
    return cfg, ckpt, graphdef, abs_state, plan


def check_pretrained(path: str | os.PathLike) -> Qwen2Config:
    """Check a Hugging Face Qwen2 directory without loading it (config, file headers, names, shapes):
    a bad one raises ValueError or FileNotFoundError naming the file, in well under a second."""
    return _open_checked(path, {})[0]


def load_pretrained(
    path: str | os.PathLike,
    mesh: jax.sharding.Mesh | None = None,
    dtype: str | None = None,
    param_dtype: str = "float32",
    **config_overrides,
) -> tuple[Qwen2ForCausalLM, Qwen2Config]:
    """Read a Hugging Face Qwen2 directory into our model, each tensor placed on its sharding.

    Parameters are kept in ``param_dtype`` whatever the checkpoint's ``torch_dtype`` (a bfloat16
    checkpoint becomes float32 master weights by default); ``dtype`` is the compute dtype (float32 when
    None). ``config_overrides`` set any other :class:`Qwen2Config` field (``remat``, ``scan_layers``...).
    """
    config_overrides = {"param_dtype": param_dtype, **config_overrides}
    if dtype is not None:
        config_overrides["dtype"] = dtype
    # Every name and shape is checked before anything is placed, so a bad checkpoint fails fast.
    cfg, ckpt, graphdef, abs_state, plan = _open_checked(path, config_overrides)
    shardings = None
    if mesh is not None:
        from roleagent_jax.parallel.sharding import param_shardings

        shardings = _flat_params(param_shardings(abs_state, mesh))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    loaded = {}
    for key, (shape, per_layer_shape, target_dtype) in plan.items():
        block = _block_reader(ckpt, _mapping(key, cfg), shape, per_layer_shape, target_dtype)
        if shardings is None:
            loaded[key] = jax.device_put(block(()), device)
        else:  # each device (of every process) reads only its own block
            loaded[key] = jax.make_array_from_callback(shape, shardings[key].get_value(), block)

    state = nnx.from_flat_state({k: v.replace(loaded[k]) for k, v in _flat_params(abs_state).items()})
    return nnx.merge(graphdef, state), cfg


def _host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_pretrained(model: Qwen2ForCausalLM, path: str | os.PathLike, tokenizer: Any = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers`` loads (Qwen2 or Llama class).

    Weights are stored in the model's ``param_dtype``. A model over MAX_SHARD_BYTES is written as
    numbered shards plus ``model.safetensors.index.json``; the host holds one shard at a time.
    In a multi-process run every process must call this (arrays are gathered); only process 0 writes.
    LoRA adapters are merged into their kernels first: the files hold a plain model.
    """
    if has_lora(model):
        model = merged(model)
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
    if not cfg.attention_bias and cfg.model_type == "qwen2":  # transformers' Qwen2 always has q/k/v biases
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
    _write_safetensors(directory, entries, fetch)  # every process takes part in the gathers
    if jax.process_index() == 0 and tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
