"""Two local CPU processes with a localhost coordinator train together and end with identical parameters.

Each process is a fresh interpreter (its own device count, `jax.distributed.initialize` with a free port);
they share one global mesh. The reference is the same program in one process over the same number of
devices. Also covers the host-side helpers of roleagent_jax.parallel.distributed without any process group.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from roleagent_jax.parallel import distributed

WORKER = Path(__file__).resolve().parent / "multihost_worker.py"
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_group(tmp: Path, num_processes: int, devices: int, extra: list[str]) -> list[tuple]:
    """Start the worker processes of one group (one coordinator port per group)."""
    port = free_port()
    group = []
    for i in range(num_processes):
        stem = tmp / f"p{num_processes}_{i}"
        cmd = [
            sys.executable,
            str(WORKER),
            "--process-id",
            str(i),
            "--num-processes",
            str(num_processes),
            "--port",
            str(port),
            "--devices",
            str(devices),
            "--out",
            f"{stem}.npz",
            *extra,
        ]
        log = open(f"{stem}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env())
        group.append((proc, log, stem))
    return group


def finish_group(group: list[tuple], timeout: float = 300) -> list[dict]:
    """Wait for every process of the group; return each one's saved arrays (or the failing log).

    A process that fails leaves its peers blocked in collectives, so the first failure stops the rest."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            codes = [proc.poll() for proc, _, _ in group]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.5)
    finally:
        for proc, log, _ in group:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    # Report the process that failed on its own before the ones killed here (negative return codes).
    for i, (proc, _, stem) in sorted(enumerate(group), key=lambda item: item[1][0].returncode < 0):
        if proc.returncode != 0:
            tail = Path(f"{stem}.log").read_text()[-3000:]
            raise AssertionError(f"process {i} of {len(group)} failed ({proc.returncode}):\n{tail}")
    return [dict(np.load(f"{stem}.npz")) for _, _, stem in group]


def _check_group(tmp: Path, extra: list[str], atol: float) -> None:
    two = start_group(tmp, num_processes=2, devices=2, extra=extra)
    one = start_group(tmp, num_processes=1, devices=4, extra=extra)
    (a, b), (ref,) = finish_group(two), finish_group(one)
    assert set(a) == set(b) == set(ref)
    # Process 0's task draw reached process 1 (its own seed would have drawn differently).
    own_draw_of_1 = np.random.default_rng(1001).integers(0, 32, 8)
    np.testing.assert_array_equal(b["__task_ids__"], a["__task_ids__"])
    assert not np.array_equal(b["__task_ids__"], own_draw_of_1)
    np.testing.assert_array_equal(a["__weights__"], ref["__weights__"])
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"processes disagree on {key}")
        np.testing.assert_allclose(
            a[key], ref[key], rtol=1e-4, atol=atol, err_msg=f"1 process differs: {key}"
        )
    names = [k for k in a if not k.startswith("__")]
    moved = [k for k in names if not np.allclose(a[k], a["__init__/" + k])]
    assert len(moved) > len(names) // 2, f"only {moved} changed"
    assert np.all(np.isfinite(a["__loss__"])) and a["__loss__"].shape[0] == 2


@pytest.mark.slow
def test_two_processes_train_step_identical_params(tmp_path):
    """The project's PPO train step (AdamW, 2 micro-batches, KL) on a 2-process fsdp mesh: processes
    agree bit for bit, and with one process up to summation order."""
    pytest.importorskip("roleagent_jax.rl.train_step", reason="the RL train step is not in the tree")
    _check_group(tmp_path, ["--step-fn", "train_step", "--mesh", "1,4,1"], atol=1e-6)


@pytest.mark.slow
def test_two_processes_sgd_step_identical_params(tmp_path):
    """A plain SGD step on a data x fsdp x tensor = 1 x 2 x 2 mesh (tensor axis across processes)."""
    _check_group(tmp_path, ["--step-fn", "sgd", "--mesh", "1,2,2"], atol=2e-6)


@pytest.mark.slow
def test_two_processes_trainer_iteration_identical_params(tmp_path):
    """One full `Trainer.iteration` (rollouts on procedural games, advantages, PPO update) in two processes."""
    extra = ["--step-fn", "trainer", "--mesh", "1,4,1"]
    a, b = finish_group(start_group(tmp_path, num_processes=2, devices=2, extra=extra), timeout=600)
    assert int(a["__rows__"]) > 0
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"processes disagree on {key}")


# ---------------------------------------------------------------- host helpers, one process


@pytest.mark.parametrize("n,count", [(0, 1), (7, 1), (7, 2), (8, 3), (128, 8), (3, 5)])
def test_process_share_partitions_range(n, count):
    shares = [distributed.process_share(n, i, count) for i in range(count)]
    assert [x for s in shares for x in s] == list(range(n))
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


def test_process_share_rejects_bad_input():
    with pytest.raises(ValueError, match="outside"):
        distributed.process_share(4, 2, 2)
    with pytest.raises(ValueError, match="negative"):
        distributed.process_share(-1, 0, 1)


def test_single_process_helpers_are_identity():
    import jax

    obj = {"probs": np.arange(3.0), "note": "x"}
    assert distributed.allgather_objects(obj) == [obj]
    assert distributed.is_main_process() == (jax.process_index() == 0)


def test_global_batch_shards_rows_and_checks_divisibility():
    from roleagent_jax.parallel.sharding import make_mesh

    mesh = make_mesh(2, 4, 1)
    x = np.arange(16 * 3).reshape(16, 3)
    out = distributed.global_batch({"x": x, "s": np.float32(2.0)}, mesh)
    np.testing.assert_array_equal(np.asarray(out["x"]), x)
    assert out["x"].sharding.spec[0] == ("data", "fsdp")
    assert len(out["x"].addressable_shards) == 8 and out["x"].addressable_shards[0].data.shape == (2, 3)
    with pytest.raises(ValueError, match="multiple of data\\*fsdp=8"):
        distributed.global_batch({"x": np.zeros((12, 2))}, mesh)
