"""Orbax checkpoints of the whole training state, so a killed run resumes exactly.

Device state (params, optimizer, step, RNG key) is saved as an array pytree, restored straight onto the
shardings of a template state; host state (task sampler logits and its RNG, AIW history, failure-memory
length, metric history, iteration) is saved as JSON next to it in the same orbax step directory.

Nothing here loses a run quietly: a fresh start refuses to run over an earlier run's checkpoints
(``claim_workdir``), a save that orbax declines or that never lands on disk raises, and a restore falls
back from an unreadable step to the one before it, naming what it could not read.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from roleagent_jax.parallel import distributed


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the folder and what to do."""


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


def saved_steps(directory: str | Path) -> list[int]:
    """The finished steps in an orbax checkpoint folder (unfinished ones carry a temporary suffix)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


WARMSTART_CHECKPOINTS = "warmstart_checkpoints"  # the warm start's own steps, under the workdir


def claim_workdir(workdir: str | Path, resume: bool, overwrite: bool) -> Path | None:
    """Make sure a run that does not resume destroys no earlier run in ``workdir``.

    With checkpoints present and ``resume`` off, refuse unless ``overwrite``; then the whole folder is
    moved aside to a timestamped sibling (returned) and the new run starts in an empty one.
    """
    workdir = Path(workdir).absolute()
    folder = workdir / "checkpoints"
    steps = saved_steps(folder)
    if not steps:  # a run killed during its warm start has only the warm start's checkpoints
        folder = workdir / WARMSTART_CHECKPOINTS
        steps = saved_steps(folder)
    if resume or not steps:
        return None
    if not overwrite:
        raise CheckpointError(
            f"{folder} holds checkpoints (steps {', '.join(map(str, steps))}) and "
            "--config.checkpoint.resume=False: choose a new --config.workdir to start fresh, or add "
            "--config.checkpoint.overwrite=True to move the earlier run aside"
        )
    aside = workdir.with_name(f"{workdir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    distributed.sync("claim_workdir/checked")  # every process saw the checkpoints before one moves them
    if distributed.is_main_process():
        workdir.rename(aside)
        print(f"moved the earlier run in {workdir} aside to {aside}", flush=True)
    distributed.sync("claim_workdir/moved")
    return aside


def _reason(err: BaseException) -> str:
    """The innermost cause of a (often chained, multi-line) orbax/TensorStore error, on one line."""
    while err.__cause__ is not None:
        err = err.__cause__
    text = " ".join(str(err).split()) or type(err).__name__
    text = text.split(" [tensorstore_spec")[0]
    return text if len(text) <= 300 else text[:297] + "..."


def _canonical(host: Any) -> str:
    return json.dumps(to_jsonable(host), sort_keys=True)


class Checkpointer:
    """Keep-N asynchronous checkpoints under `directory`; `restore` returns None when there is none."""

    def __init__(self, directory: str | Path, keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self._recover_replaced()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "host"))
        self._pending: int | None = None  # the step of a save that may still be in flight

    def _recover_replaced(self) -> None:
        """Finish an interrupted replacement: keep the new step when it landed, else put the old one back."""
        if distributed.is_main_process() and self.directory.is_dir():
            for old in sorted(self.directory.glob("*.replaced")):
                step_dir = self.directory / old.name.removesuffix(".replaced")
                if step_dir.is_dir():
                    shutil.rmtree(old)
                else:
                    old.rename(step_dir)
        distributed.sync("checkpointer/recovered")

    def _finish_pending(self) -> None:
        """Wait for the last save and check that its step is on disk: orbax only logs a failed write."""
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - the background write failed: name it, keep its cause
            raise CheckpointError(
                f"checkpoint step {step} could not be written to {self.directory}: {_reason(err)}"
            ) from err
        if step is None:
            return
        self._manager.reload()
        if step not in self._manager.all_steps():
            raise CheckpointError(
                f"checkpoint step {step} was not written to {self.directory} (see the orbax error above)"
            )
        old = self.directory / f"{step}.replaced"
        if old.exists() and distributed.is_main_process():
            shutil.rmtree(old)
        distributed.sync(f"checkpointer/saved/{step}")

    def _stored_host(self, step: int) -> Any:
        restored = self._manager.restore(step, args=ocp.args.Composite(host=ocp.args.JsonRestore()))
        return restored.host

    def save(self, step: int, state: Any, host: dict, replace: bool = False) -> None:
        """Start saving; with async_save the device arrays are copied and written in the background.

        A step that exists raises, unless ``replace``: then a step whose host state is unchanged is
        left as it is (the device state of a step is fixed by its iteration), and otherwise the new
        save replaces it, the old copy kept aside until the new one is on disk.
        """
        self._finish_pending()
        if step in self._manager.all_steps():
            if not replace:
                raise CheckpointError(f"checkpoint step {step} already exists in {self.directory}")
            if _canonical(self._stored_host(step)) == _canonical(host):
                return
            if distributed.is_main_process():
                (self.directory / str(step)).rename(self.directory / f"{step}.replaced")
            distributed.sync(f"checkpointer/replace/{step}")
            self._manager.reload()
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(to_jsonable(host))
            ),
        )
        if not saved:
            later = [s for s in self._manager.all_steps() if s > step]
            raise CheckpointError(
                f"orbax declined to save checkpoint step {step} in {self.directory} "
                f"(it holds later steps {later})"
            )
        self._pending = step

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, template_state: Any, step: int | None = None) -> tuple[Any, dict] | None:
        """Restore onto the dtypes and shardings of `template_state` (a real or abstract state).

        Without ``step``, the newest readable step: each unreadable one is named with the reason, and
        moved aside (``<step>.unreadable-<time>``) so the resumed run can write that step again.
        """
        steps = sorted(self._manager.all_steps(), reverse=True) if step is None else [step]
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template_state)
        unreadable: dict[int, str] = {}
        for s in steps:
            try:
                host = self._read(s, "host", ocp.args.JsonRestore())
                state = self._read(s, "state", ocp.args.StandardRestore(abstract))
            except CheckpointError as err:
                unreadable[s] = str(err)
                print(f"unreadable checkpoint {err}", file=sys.stderr, flush=True)
                continue
            self._set_aside(list(unreadable))
            return state, from_jsonable(host)
        if unreadable:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory} ({'; '.join(unreadable.values())}): delete "
                f"{self.directory} to start this run afresh"
            )
        return None

    def _read(self, step: int, item: str, args: Any) -> Any:
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**{item: args}))
        except Exception as err:  # noqa: BLE001 - whatever the failure, the step is unreadable
            raise CheckpointError(
                f"step {step} ({self.directory / str(step) / item}): {_reason(err)}"
            ) from err
        return restored[item]

    def _set_aside(self, steps: list[int]) -> None:
        if not steps:
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if distributed.is_main_process():
            for s in steps:
                aside = self.directory / f"{s}.unreadable-{stamp}"
                (self.directory / str(s)).rename(aside)
                print(f"moved unreadable checkpoint step {s} aside to {aside}", file=sys.stderr, flush=True)
        distributed.sync("checkpointer/set_aside")
        self._manager.reload()

    def wait(self) -> None:
        self._finish_pending()

    def check(self) -> None:
        """Raise now if the last background save has finished and failed; return at once while it still
        runs. A failure is seen at the next iteration, not `checkpoint.every` iterations later. On
        several processes the check waits at the next save instead (its barrier needs all of them)."""
        if self._pending is None or jax.process_count() > 1 or self._manager.is_saving_in_progress():
            return
        self._finish_pending()

    def close(self) -> None:
        try:
            self._finish_pending()
        finally:
            self._manager.close()


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write (temp file + rename): a kill never leaves a half-written file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(obj), indent=1))
    tmp.replace(path)
