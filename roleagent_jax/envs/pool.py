"""Many environments of one family stepped in parallel worker processes.

Env slot i lives in worker i % num_workers. A command (reset or step) goes to every worker at once and
each worker answers env by env, so the pool's throughput grows with the workers and a per-step
timeout can be enforced: a worker that makes no progress for `step_timeout` seconds is killed. A
worker that dies (crash, kill, timeout) is restarted at once; every episode it hosted is reported as
failed (`Observation.failed`, done) and its slots play again after their next reset.

Workers are started with the 'spawn' context and without re-importing the caller's `__main__`; each
unpickles the family, calls its `start_worker()` and builds envs with `make_env(max_steps)`, so a
worker holds the family's engine only, never JAX.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import wait

from roleagent_jax.envs.base import Family, Observation, TaskPool

SPAWN = mp.get_context("spawn")  # workers never inherit the parent's threads (JAX)


@contextmanager
def main_hidden() -> Iterator[None]:
    """Processes spawned inside this block skip the caller's `__main__` (they import no JAX).

    Without __file__/__spec__ on __main__, spawn does not re-run the caller's script in the child.
    """
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


def _worker_main(conn, family: Family, max_steps: int) -> None:
    """Worker loop: one env of the family per slot it hosts; answers item by item, then 'end'."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    family.start_worker()
    conn.send(("ready", None, None))  # set-up done: from now on the timeouts apply
    envs: dict = {}
    while True:
        try:
            kind, items = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "close":
            return
        if kind == "probe":
            conn.send(("ok", -1, {"pid": os.getpid(), "jax_imported": "jax" in sys.modules}))
        for slot, arg in items:
            try:
                if kind == "reset":
                    if slot not in envs:
                        envs[slot] = family.make_env(max_steps)
                    task, expert = arg
                    out = envs[slot].reset(task, expert=expert)
                elif kind == "step":
                    out = envs[slot].step(arg)
                else:
                    raise ValueError(f"unknown command {kind!r}")
                conn.send(("ok", slot, out))
            except Exception as exc:  # one bad game must not take the other slots down
                conn.send(("error", slot, f"{type(exc).__name__}: {exc}"))
        conn.send(("end", None, None))


class _Worker:
    def __init__(self, index: int, settings: tuple):
        self.index = index
        self.ready = False
        parent, child = SPAWN.Pipe()
        self.conn = parent
        self.proc = SPAWN.Process(
            target=_worker_main, args=(child, *settings), daemon=True, name=f"envpool-worker-{index}"
        )
        with main_hidden():
            self.proc.start()
        child.close()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class EnvPool:
    """Parallel environments of `family` addressed by slot; slot i plays pool[task_ids[i]] after
    reset(task_ids). `expert` is the default of `reset`'s flag of the same name."""

    def __init__(
        self,
        family: Family,
        pool: TaskPool,
        num_workers: int,
        step_timeout: float = 30.0,
        max_steps: int = 50,
        expert: bool = False,
        reset_timeout: float | None = None,
        start_timeout: float = 120.0,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0, got {step_timeout}")
        self.family = family
        self.pool = pool
        self.num_workers = num_workers
        self.step_timeout = float(step_timeout)
        # A first reset loads, translates and (for the expert) plans a game: allow it more than a step.
        self.reset_timeout = float(reset_timeout) if reset_timeout else max(4 * self.step_timeout, 120.0)
        self.start_timeout = float(start_timeout)
        self.expert = bool(expert)
        self._settings = (family, max_steps)
        self._workers = [_Worker(i, self._settings) for i in range(num_workers)]
        self._task_of: dict[int, int] = {}  # slot -> task id of its current episode
        self._lost: set[int] = set()  # slots whose episode died with a worker
        self._done: dict[int, Observation] = {}  # slot -> final observation once the episode ended
        self.restarts = 0
        self._closed = False

    # ---------------------------------------------------------------- public API
    def reset(self, task_ids: list[int], expert: bool | None = None) -> list[Observation]:
        """Start one episode per slot: slot i plays task pool[task_ids[i]]. Returns one observation per slot.

        `expert=True` puts the expert plan in every observation of these episodes (default: the pool's
        `expert` setting)."""
        n = len(self.pool)
        for t in task_ids:
            if not 0 <= int(t) < n:
                raise ValueError(f"task id {t} out of range for a pool of {n} tasks")
        self._check_open()
        for slot, t in enumerate(task_ids):
            self._task_of[slot] = int(t)
            self._lost.discard(slot)
            self._done.pop(slot, None)
        expert = self.expert if expert is None else bool(expert)
        items = [(slot, (self.pool.tasks[int(t)], expert)) for slot, t in enumerate(task_ids)]
        answers = self._run("reset", items)
        out = []
        for slot in range(len(task_ids)):
            status, payload = answers[slot]
            if status == "ok":
                out.append(payload)
            else:
                self._lost.add(slot)
                out.append(self._failed(payload))
        return out

    def step(self, actions: dict[int, str]) -> dict[int, Observation]:
        """Apply one action per listed slot. Returns slot -> observation."""
        self._check_open()
        results: dict[int, tuple] = {}
        items = []
        for slot, action in actions.items():
            if slot not in self._task_of:
                raise ValueError(f"slot {slot} was never reset")
            if slot in self._lost:
                results[slot] = self._failed("environment lost with its worker")
            elif slot in self._done:
                results[slot] = dataclasses.replace(self._done[slot], reward=0.0)
            else:
                items.append((slot, str(action)))
        for slot, (status, payload) in self._run("step", items).items():
            if status == "ok":
                results[slot] = payload
                if payload.done:
                    self._done[slot] = payload
            else:
                self._lost.add(slot)
                results[slot] = self._failed(payload)
        return results

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def probe(self) -> list[dict]:
        """Each worker's pid and whether JAX is loaded in it (it never should be)."""
        self._check_open()
        out = []
        for w in self._workers:
            w.conn.send(("probe", []))
            while True:
                status, _, payload = w.conn.recv()
                if status == "ready":
                    w.ready = True
                elif status == "end":
                    break
                else:
                    out.append(payload)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.conn.send(("close", []))
            except (BrokenPipeError, OSError):
                pass
        for w in self._workers:
            w.proc.join(timeout=5)
            w.kill()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool is closed")

    @staticmethod
    def _failed(reason: str) -> Observation:
        """The final observation of an episode lost with its env (crash, timeout, dead worker)."""
        return Observation(text="", anchor="", admissible=[], done=True, failed=True, info={"error": reason})

    def _restart(self, w: int, reason: str, answers: dict, pending: dict) -> None:
        """Replace worker w; its pending items fail and every slot it hosted loses its episode."""
        self._workers[w].kill()
        for slot in pending.pop(w, ()):
            answers[slot] = ("error", reason)
        for slot in self._task_of:
            if slot % self.num_workers == w:
                self._lost.add(slot)
        self._workers[w] = _Worker(w, self._settings)
        self.restarts += 1

    def _run(self, kind: str, items: list[tuple[int, object]]) -> dict[int, tuple[str, object]]:
        """Send items to their workers, collect answers, enforce the per-step timeout."""
        answers: dict[int, tuple[str, object]] = {}
        by_worker: dict[int, list] = {}
        for slot, arg in items:
            by_worker.setdefault(slot % self.num_workers, []).append((slot, arg))
        pending: dict[int, set[int]] = {}
        last: dict[int, float] = {}
        timeout = self.step_timeout if kind == "step" else self.reset_timeout

        def limit(w: int) -> float:
            return timeout if self._workers[w].ready else max(timeout, self.start_timeout)

        for w, its in by_worker.items():
            pending[w] = {slot for slot, _ in its}
            try:
                self._workers[w].conn.send((kind, its))
                last[w] = time.monotonic()
            except (BrokenPipeError, OSError):
                self._restart(w, "worker process died", answers, pending)
        while pending:
            now = time.monotonic()
            deadline = min(last[w] + limit(w) for w in pending)
            handles = {}
            for w in pending:
                handles[self._workers[w].conn] = w
                handles[self._workers[w].proc.sentinel] = w
            ready = wait(list(handles), timeout=max(0.0, deadline - now))
            for h in ready:
                w = handles[h]
                if w not in pending:
                    continue
                if self._drain(w, answers, pending, last):
                    continue
                self._restart(w, "worker process died", answers, pending)
            now = time.monotonic()
            for w in [w for w in pending if now - last[w] > limit(w)]:
                self._restart(w, f"no answer within {kind}_timeout={limit(w)}s", answers, pending)
        return answers

    def _drain(self, w: int, answers: dict, pending: dict, last: dict) -> bool:
        """Read every message worker w has sent; False when its pipe is broken (the worker died)."""
        conn = self._workers[w].conn
        try:
            while conn.poll():
                status, slot, payload = conn.recv()
                last[w] = time.monotonic()
                if status == "ready":
                    self._workers[w].ready = True
                    continue
                if status == "end":
                    pending.pop(w, None)
                    return True
                answers[slot] = (status, payload)
                pending[w].discard(slot)
        except (EOFError, OSError):
            return False
        return self._workers[w].proc.is_alive()
