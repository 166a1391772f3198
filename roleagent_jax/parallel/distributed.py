"""Multi-host helpers: who does which share of the host work, and how host state stays identical.

In a multi-host run every process executes the same program over one global mesh. Device work is
identical by construction (jitted functions over global arrays); host work is not, so:

- environments are split: each process steps its own contiguous share of the rollout slots
  (``process_share``) and the results are gathered to every process (``allgather_objects``);
- host decisions (the AIW task sampler's draw, its logits after a round) are made by every process
  from the same seed and the same gathered trajectories, so all feed the same batch to the same
  compiled step without a broadcast;
- global batches are built from host arrays that every process holds in full (``global_batch``);
- logging and file writes other than orbax checkpoints happen on process 0 (``is_main_process``);
  orbax's CheckpointManager is called from all processes (it coordinates the writes itself).

Every helper is a no-op (or the identity) in a single-process run, so the trainer calls them always.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Join the multi-process group; returns True when this is a multi-process run.

    With explicit arguments (tests, hand launches) they are used as given. Without them the standard
    environment is honoured: ``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``, SLURM or
    Open MPI (see ``sharding.maybe_initialize_distributed``), or ``ROLEAGENT_DISTRIBUTED=auto`` (set by
    launchers/tpu_vm.sh on multi-worker slices), where ``jax.distributed.initialize()`` discovers the peers
    from the TPU VM metadata itself.
    """
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    if coordinator_address is not None:
        if num_processes is None or process_id is None:
            raise ValueError("coordinator_address needs num_processes and process_id as well")
        jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id)
        return jax.process_count() > 1
    if os.environ.get("ROLEAGENT_DISTRIBUTED") == "auto":
        jax.distributed.initialize()  # TPU slice / cluster: JAX discovers the peers from its environment
        return jax.process_count() > 1
    from roleagent_jax.parallel.sharding import maybe_initialize_distributed

    maybe_initialize_distributed()
    return jax.process_count() > 1


def is_main_process() -> bool:
    """Process 0 logs, writes reports and runs the AIW sampler whose results everyone uses."""
    return jax.process_index() == 0


def process_share(n: int, process_index: int | None = None, process_count: int | None = None) -> range:
    """This process's contiguous share of ``n`` items (rollout slots, env workers).

    Shares differ in size by at most one; the first ``n % count`` processes take the extra item, so the
    concatenation over processes in index order is ``range(n)``.
    """
    if n < 0:
        raise ValueError(f"cannot share a negative number of items ({n})")
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    if not 0 <= index < count:
        raise ValueError(f"process_index {index} is outside 0..{count - 1}")
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return range(start, start + base + (index < extra))


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj``, in process order, on every process (e.g. each host's trajectories)."""
    if jax.process_count() == 1:
        return [obj]
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([payload.size], np.int64))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: payload.size] = payload
    gathered = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)
    return [pickle.loads(gathered[i, : sizes[i]].tobytes()) for i in range(len(sizes))]


def global_batch(arrays: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Global arrays with rows over ``(data, fsdp)`` from host arrays every process holds in full.

    Each process materialises only the row blocks of its own devices, so this works unchanged on one
    host or many (``jnp.asarray`` would instead put the whole batch on one local device).
    """
    out = {}
    for key, value in arrays.items():
        value = np.asarray(value)
        spec = P(("data", "fsdp"), *([None] * (value.ndim - 1))) if value.ndim else P()
        rows = mesh.shape["data"] * mesh.shape["fsdp"]
        if value.ndim and value.shape[0] % rows:
            raise ValueError(
                f"batch field {key!r} has {value.shape[0]} rows, not a multiple of data*fsdp={rows}: "
                "choose micro/mini-batch sizes divisible by the number of batch shards"
            )
        sharding = NamedSharding(mesh, spec)
        out[key] = jax.make_array_from_callback(value.shape, sharding, lambda idx, v=value: v[idx])
    return out


def fetch(tree: Any) -> Any:
    """Host numpy copies of (possibly non-addressable) global arrays, identical on every process."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, tree)
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def sync(name: str) -> None:
    """Barrier: every process reaches ``name`` before any continues (e.g. before reading a new file)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
