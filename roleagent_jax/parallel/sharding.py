"""Device mesh and the one place where parameter, batch and KV-cache partitioning is decided.

Axes: ``data`` (pure data parallelism), ``fsdp`` (data parallelism with parameters sharded over it),
``tensor`` (heads / intermediate / vocab split inside a layer). Activations put their leading batch dim
over ``(data, fsdp)``.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

log = logging.getLogger(__name__)

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
BATCH_SPEC = P(BATCH_AXES)

# Regex over the "/"-joined parameter path (e.g. "layers/3/attn/q_proj/kernel") -> spec of the
# per-layer array. Layer-stacked params (scan_layers) get a leading replicated layer dim added.
PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"(^|/)embed/embedding$", P("tensor", "fsdp")),  # [vocab, hidden]
    (r"attn/(q|k|v)_proj/kernel$", P("fsdp", "tensor", None)),  # [hidden, heads, head_dim]
    (r"attn/(q|k|v)_proj/bias$", P("tensor", None)),  # [heads, head_dim]
    (r"attn/o_proj/kernel$", P("tensor", None, "fsdp")),  # [heads, head_dim, hidden]
    (r"mlp/(gate|up)_proj/kernel$", P("fsdp", "tensor")),  # [hidden, intermediate]
    (r"mlp/down_proj/kernel$", P("tensor", "fsdp")),  # [intermediate, hidden]
    (r"(^|/)lm_head/kernel$", P("fsdp", "tensor")),  # [hidden, vocab]
    (r"norm/scale$", P(None)),  # [hidden]
    # LoRA adapters (tiny): the rank dim and the dims the kernel puts over fsdp stay replicated (no
    # gather per use); a dim the kernel splits over tensor is split alike, so the adapter's output
    # (B) or input (A) lines up with the kernel's without a reshard.
    (r"attn/(q|k|v)_proj/lora/a$", P(None, None)),  # [hidden, rank]
    (r"attn/(q|k|v)_proj/lora/b$", P(None, "tensor", None)),  # [rank, heads, head_dim]
    (r"attn/o_proj/lora/a$", P("tensor", None, None)),  # [heads, head_dim, rank]
    (r"attn/o_proj/lora/b$", P(None, None)),  # [rank, hidden]
    (r"mlp/(gate|up)_proj/lora/a$", P(None, None)),  # [hidden, rank]
    (r"mlp/(gate|up)_proj/lora/b$", P(None, "tensor")),  # [rank, intermediate]
    (r"mlp/down_proj/lora/a$", P("tensor", None)),  # [intermediate, rank]
    (r"mlp/down_proj/lora/b$", P(None, None)),  # [rank, hidden]
)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over ``devices`` (default: all); one size may be -1 to fill."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(
            f"mesh axis sizes must be positive or -1, got data={data} fsdp={fsdp} tensor={tensor}"
        )
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"{len(devices)} devices cannot be split into a mesh with fixed axes of product {known}"
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} needs {math.prod(sizes)} devices, "
            f"have {len(devices)}"
        )
    grid = np.asarray(devices, dtype=object).reshape(sizes)
    return Mesh(grid, AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)


def _path_str(path: tuple) -> str:
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    if parts and parts[-1] in ("value", "raw_value"):
        parts.pop()
    return "/".join(parts)


def _axis_size(mesh: Mesh, entry: Any) -> int:
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[n] for n in names)


def spec_for(path: str, shape: tuple[int, ...], rules=PARTITION_RULES, mesh: Mesh | None = None) -> P:
    """The spec of one parameter. With ``mesh``, dims its axes do not divide are replicated instead."""
    match = next(((pattern, spec) for pattern, spec in rules if re.search(pattern, path)), None)
    if match is None:
        raise ValueError(f"no partition rule matches parameter {path!r}: add one to PARTITION_RULES")
    pattern, spec = match
    entries = list(spec)
    if len(entries) > len(shape):
        raise ValueError(f"rule {pattern!r} gives {spec} for {path!r} of rank {len(shape)}")
    entries = [None] * (len(shape) - len(entries)) + entries  # leading layer dim of stacked params
    if mesh is not None:
        for i, entry in enumerate(entries):
            if entry is not None and shape[i] % _axis_size(mesh, entry):
                log.info("replicating dim %d of %s (size %d not divisible by %s)", i, path, shape[i], entry)
                entries[i] = None
    return P(*entries)


def _state_of(tree: Any) -> Any:
    if isinstance(tree, nnx.Module):
        return nnx.state(tree)
    return tree


def param_specs(state_or_abstract: Any, rules=PARTITION_RULES, mesh: Mesh | None = None) -> Any:
    """PartitionSpecs with the structure of the given state (a model, an nnx.State or abstract state)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: spec_for(_path_str(path), tuple(x.shape), rules, mesh), _state_of(state_or_abstract)
    )


def param_shardings(state_or_abstract: Any, mesh: Mesh, rules=PARTITION_RULES) -> Any:
    """NamedShardings for every parameter (rules, with replication where a dim does not divide)."""
    specs = param_specs(state_or_abstract, rules, mesh)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Move every parameter of ``model`` onto its sharding (in place; returns the model)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, param_shardings(state, mesh)))
    return model


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch/row) dim over ``(data, fsdp)``, other dims replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


_initialized = False


def maybe_initialize_distributed() -> None:
    """Call ``jax.distributed.initialize()`` when this process is one of several; no-op otherwise.

    Multi-process launches are recognised by ``JAX_COORDINATOR_ADDRESS`` (with ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``), or by a SLURM / Open MPI launch of more than one task, which JAX auto-detects.
    """
    global _initialized
    if _initialized or jax.distributed.is_initialized():
        return
    env = os.environ
    coordinator = env.get("JAX_COORDINATOR_ADDRESS")
    if coordinator:
        kwargs: dict[str, Any] = {"coordinator_address": coordinator}
        if "JAX_NUM_PROCESSES" in env:
            kwargs["num_processes"] = int(env["JAX_NUM_PROCESSES"])
        if "JAX_PROCESS_ID" in env:
            kwargs["process_id"] = int(env["JAX_PROCESS_ID"])
        jax.distributed.initialize(**kwargs)
    elif int(env.get("SLURM_NTASKS", "1")) > 1 or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        jax.distributed.initialize()
    else:
        return
    _initialized = True
