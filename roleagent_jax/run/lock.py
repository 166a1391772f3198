"""One run per workdir: `<workdir>/run.lock` names the process that holds it.

Two runs on one workdir would both write checkpoints, metrics and the failure memory, and a later
resume would accept the mixture. The lock is a file created atomically (`O_EXCL`) holding the holder's
pid, host and start time; a thread rewrites its time stamp every `HEARTBEAT_S` seconds. A second run
meets it at start-up and is refused in one line naming the workdir and the holder. A lock left by a
dead process is taken over: on the same host when its pid is gone, from any host when its stamp is
older than `STALE_S` (a lost host, whose pid cannot be asked about).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

LOCK_FILE = "run.lock"
HEARTBEAT_S = 30.0
STALE_S = 300.0


class WorkdirBusy(RuntimeError):
    """Another live process holds the workdir; the message names it."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # half-written or unreadable: judged by the file's age alone
    return holder if isinstance(holder, dict) else {}


def holder_is_alive(path: Path, now: float | None = None) -> bool:
    """Whether the lock at `path` belongs to a process that may still run."""
    holder = _read(path)
    if holder is None:
        return False
    now = time.time() if now is None else now
    try:
        stamp = max(float(holder.get("stamp", 0.0)), path.stat().st_mtime)
    except (OSError, ValueError, TypeError):
        return False
    if now - stamp > STALE_S:
        return False
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        return _alive(holder["pid"])
    return True


def describe(path: Path) -> str:
    holder = _read(path) or {}
    since = holder.get("started")
    when = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')}{when}"


def check_free(workdir: str | Path) -> None:
    """Raise `WorkdirBusy` when a live process holds `workdir` (before anything there is touched)."""
    path = Path(workdir).absolute() / LOCK_FILE
    if holder_is_alive(path):
        raise WorkdirBusy(
            f"--config.workdir={str(path.parent)!r} is in use by {describe(path)} ({path}): wait for "
            "that run to end or stop it, or choose another --config.workdir"
        )


class WorkdirLock:
    """The held lock of one workdir; `release()` (idempotent) removes it and stops the heartbeat."""

    def __init__(self, workdir: str | Path):
        self.path = Path(workdir).absolute() / LOCK_FILE
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        self._take()
        self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
        self._thread.start()

    def _payload(self) -> bytes:
        return json.dumps({**self._info, "stamp": time.time()}).encode()

    def _take(self) -> None:
        for _ in range(2):  # a stale lock is removed once, then created afresh
            check_free(self.path.parent)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                stale = describe(self.path)
                self.path.unlink(missing_ok=True)
                print(f"took over the lock of {self.path.parent} left by {stale}, which is gone", flush=True)
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(self._payload())
            return
        check_free(self.path.parent)
        raise WorkdirBusy(
            f"--config.workdir={str(self.path.parent)!r}: another run took its lock at start-up"
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                tmp = self.path.with_name(LOCK_FILE + f".{os.getpid()}.tmp")
                tmp.write_bytes(self._payload())
                tmp.replace(self.path)
            except OSError:
                pass  # a full disk must not kill the run from here; the stamp just ages

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        holder = _read(self.path)
        if holder and holder.get("pid") == self._info["pid"] and holder.get("host") == self._info["host"]:
            self.path.unlink(missing_ok=True)
