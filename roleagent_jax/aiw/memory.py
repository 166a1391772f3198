"""Append-only failure memory: one JSON record per line, crash-safe and exactly resumable.

Each record is written with one ``os.write`` of a complete line on an ``O_APPEND`` descriptor, then
fsync'd, so a crash can leave at most a torn *last* line; loading truncates such a tail away. A
checkpoint stores only (record count, byte offset, digest of that prefix): resuming truncates the
file back to the offset, so records appended after the checkpoint (by the run that crashed) vanish
and the memory equals what it was when the checkpoint was taken.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from roleagent_jax.types import FailureReport, Trajectory

SUMMARY_CHARS = 200


def trajectory_digest(traj: Trajectory) -> dict[str, str]:
    """A stable hash of what happened plus a short readable action summary."""
    h = hashlib.sha256()
    h.update(f"{traj.task_id}\x1f{traj.goal}".encode())
    for s in traj.steps:
        h.update(f"\x1e{s.action}\x1f{s.valid}\x1f{s.next_observation}".encode())
    acts = [s.action if s.valid and s.action else "<invalid>" for s in traj.steps]
    summary = " | ".join(acts)
    if len(summary) > SUMMARY_CHARS:
        summary = summary[: SUMMARY_CHARS - 3] + "..."
    return {"hash": h.hexdigest()[:16], "actions": summary, "n_steps": str(len(traj.steps))}


class FailureMemory:
    """Failure reports of the whole run, in memory and in ``path`` (JSONL). Queryable by type and task."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = []
        self._ends: list[int] = []  # byte offset just past each record's line
        self.n_skipped = 0  # corrupt complete lines skipped at load (never written by this class)
        self._load()

    def _load(self) -> None:
        data = self.path.read_bytes() if self.path.exists() else b""
        cut = data.rfind(b"\n") + 1
        if cut < len(data):  # torn last record from a crash mid-write: drop it
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)
                fh.flush()
                os.fsync(fh.fileno())
            data = data[:cut]
        self.records, self._ends, self.n_skipped = [], [], 0
        pos = 0
        for line in data.splitlines(keepends=True):
            pos += len(line)
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                self.n_skipped += 1
                continue
            if isinstance(rec, dict):
                self.records.append(rec)
                self._ends.append(pos)
            else:
                self.n_skipped += 1

    def __len__(self) -> int:
        return len(self.records)

    @property
    def byte_size(self) -> int:
        return self._ends[-1] if self._ends else 0

    def add(self, iteration: int, traj: Trajectory, report: FailureReport) -> dict:
        return self.add_many([(iteration, traj, report)])[0]

    def add_many(self, items: Iterable[tuple[int, Trajectory, FailureReport]]) -> list[dict]:
        """Append records (one write per line, one fsync for the batch) and return them."""
        recs = []
        for iteration, traj, report in items:
            rec = {
                "iteration": int(iteration),
                "task_id": int(traj.task_id),
                "task_type": traj.task_type,
                "goal": traj.goal,
                **{k: v for k, v in report.to_dict().items() if k != "raw"},
                "raw": report.raw[:1000],
                "digest": trajectory_digest(traj),
            }
            recs.append(rec)
        if not recs:
            return []
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for rec in recs:
                line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
                view = memoryview(line)
                while view:  # os.write may be partial for huge buffers; finish the same line
                    view = view[os.write(fd, view) :]
                self.records.append(rec)
                self._ends.append(self.byte_size + len(line))
            os.fsync(fd)
        finally:
            os.close(fd)
        return recs

    def records_by_type(self, failure_type: str) -> list[dict]:
        return [r for r in self.records if r.get("failure_type") == failure_type]

    def records_for_task(self, task_id: int) -> list[dict]:
        return [r for r in self.records if r.get("task_id") == task_id]

    def type_counts(self) -> dict[str, int]:
        return dict(Counter(r.get("failure_type", "unknown") for r in self.records))

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the path and how much of the file belongs to this state."""
        size = self.byte_size
        prefix = self.path.read_bytes()[:size] if self.path.exists() else b""
        digest = hashlib.sha256(prefix).hexdigest()
        return {"path": str(self.path), "n_records": len(self.records), "byte_offset": size, "sha256": digest}

    def load_state_dict(self, state: dict) -> None:
        """Return the memory (and its file) to the checkpoint: drop every byte after ``byte_offset``."""
        off = int(state["byte_offset"])
        data = self.path.read_bytes()[:off] if self.path.exists() else b""
        if len(data) < off or hashlib.sha256(data).hexdigest() != state["sha256"]:
            raise ValueError(
                f"failure memory {self.path} does not hold the checkpoint's first {off} bytes "
                "(file replaced or truncated); restore the memory file that belongs to this checkpoint"
            )
        with open(self.path, "a+b") as fh:
            fh.truncate(off)
            fh.flush()
            os.fsync(fh.fileno())
        self._load()
        if len(self.records) != int(state["n_records"]):
            raise ValueError(
                f"failure memory holds {len(self.records)} records, checkpoint says {state['n_records']}"
            )
