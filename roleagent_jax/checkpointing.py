"""Orbax checkpoints of the whole training state, so a killed run resumes exactly.

Device state (params, optimizer, step, RNG key) is saved as an array pytree, restored straight onto the
shardings of a template state; host state (task sampler logits and its RNG, AIW history, failure-memory
length, metric history, iteration) is saved as JSON next to it in the same orbax step directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def to_jsonable(obj: Any) -> Any:
    """Numpy scalars/arrays (e.g. a numpy Generator's state) into plain JSON values."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        return {k: from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_jsonable(v) for v in obj]
    return obj


class Checkpointer:
    """Keep-N asynchronous checkpoints under `directory`; `restore` returns None when there is none."""

    def __init__(self, directory: str | Path, keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "host"))

    def save(self, step: int, state: Any, host: dict) -> None:
        """Start saving; with async_save the device arrays are copied and written in the background."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(to_jsonable(host))
            ),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, template_state: Any, step: int | None = None) -> tuple[Any, dict] | None:
        """Restore onto the dtypes and shardings of `template_state` (a real or abstract state)."""
        step = self._manager.latest_step() if step is None else step
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template_state)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()),
        )
        return restored.state, from_jsonable(restored.host)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write (temp file + rename): a kill never leaves a half-written file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(obj), indent=1))
    tmp.replace(path)
