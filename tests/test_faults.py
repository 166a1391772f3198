"""Faults during a run, as an operator meets them on a tiny run: each ends the process within a minute
with one line and its documented exit code (`roleagent_jax.config.exit_codes`), loses nothing saved, and the
same command resumes where that makes sense."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_trainer import ROOT, cli, env, run_cmd

from roleagent_jax.config import exit_codes
from roleagent_jax.run.lock import LOCK_FILE, STALE_S, WorkdirBusy, WorkdirLock

FAULT = Path(__file__).resolve().parent / "fault_in_run.py"
QUICK = ("--config.env.eval_splits=()", "--config.log.progress=false", "--config.log.tensorboard=false")
FAULT_TIMEOUT = (
    1200  # the tiny run's set-up on a busy machine; each fault itself ends the process within a minute
)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ----------------------------------------------------------------------------------------------------
# one run per workdir


def test_a_second_run_on_a_held_workdir_is_refused_in_one_line(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    lock = WorkdirLock(workdir)
    try:
        out = run_cmd(cli(workdir, "--config.iterations=1", *QUICK), 300)
    finally:
        lock.release()
    assert out.returncode == exit_codes.USAGE, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1, lines
    assert str(workdir) in lines[0] and f"process {os.getpid()} on {socket.gethostname()}" in lines[0]
    assert sorted(p.name for p in workdir.iterdir()) == []  # nothing of the second run was written


def test_the_lock_is_exclusive_and_released(tmp_path):
    lock = WorkdirLock(tmp_path)
    with pytest.raises(WorkdirBusy, match=f"process {os.getpid()}"):
        WorkdirLock(tmp_path)
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    WorkdirLock(tmp_path).release()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    """kill -9 leaves the lock file: its pid is gone on this host, so the next run takes it over."""
    stale = {"pid": dead_pid(), "host": socket.gethostname(), "started": time.time(), "stamp": time.time()}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stale))
    lock = WorkdirLock(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"process {stale['pid']}" in capsys.readouterr().out
    lock.release()


def test_a_lock_of_a_lost_host_is_taken_over_once_its_stamp_is_old(tmp_path):
    path = tmp_path / LOCK_FILE
    other = {"pid": 1, "host": "some-other-host", "started": 0.0, "stamp": time.time()}
    path.write_text(json.dumps(other))
    with pytest.raises(WorkdirBusy, match="some-other-host"):  # it may still run: its stamp is fresh
        WorkdirLock(tmp_path)
    old = time.time() - STALE_S - 60
    path.write_text(json.dumps({**other, "stamp": old}))
    os.utime(path, (old, old))
    WorkdirLock(tmp_path).release()


@pytest.mark.slow  # a whole tiny run (or two) in a subprocess
def test_a_run_killed_with_sigkill_leaves_a_lock_the_next_run_takes_over(tmp_path):
    workdir = tmp_path / "run"
    args = cli(workdir, "--config.iterations=1", "--config.checkpoint.every=1", *QUICK)
    proc = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + FAULT_TIMEOUT
    while time.time() < deadline and not (workdir / LOCK_FILE).exists():
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads((workdir / LOCK_FILE).read_text())["pid"] == proc.pid
    out = run_cmd(args, FAULT_TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"took over the lock of {workdir} left by process {proc.pid}" in out.stdout
    assert not (workdir / LOCK_FILE).exists()


# ----------------------------------------------------------------------------------------------------
# a failed save, a full disk


@pytest.mark.slow  # a whole tiny run (or two) in a subprocess
def test_a_failed_background_save_ends_the_run_in_one_line(tmp_path):
    """Disk full in orbax's background write: exit 2 at once (not at the next save, not a hang), one
    line, the lock released; the same command resumes once there is space."""
    workdir = tmp_path / "run"
    args = cli(workdir, "--config.iterations=2", "--config.checkpoint.every=1", *QUICK)
    out = run_cmd([sys.executable, str(FAULT), "save_enospc", *args[3:]], FAULT_TIMEOUT)
    assert out.returncode == exit_codes.USAGE, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and "disk full" in lines[0] and "run the same command to resume" in lines[0], lines
    assert not (workdir / LOCK_FILE).exists()
    assert not [p for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    again = run_cmd(args, FAULT_TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.slow  # a whole tiny run (or two) in a subprocess
def test_disk_full_outside_the_checkpoints_is_exit_2_in_one_line(tmp_path):
    args = cli(tmp_path / "run", "--config.iterations=1", *QUICK)
    out = run_cmd([sys.executable, str(FAULT), "metrics_enospc", *args[3:]], FAULT_TIMEOUT)
    assert out.returncode == exit_codes.USAGE, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and "disk full" in lines[0] and "No space left on device" in lines[0], lines


@pytest.mark.slow  # a whole tiny run in a subprocess
@pytest.mark.skipif(shutil.which("chattr") is None or os.geteuid() != 0, reason="needs chattr as root")
def test_an_unwritable_checkpoints_folder_ends_the_run_instead_of_hanging(tmp_path):
    """`chattr +i <workdir>/checkpoints`: orbax's write fails with EPERM and its threads would wait
    forever at interpreter exit; the run ends with one line and exit 2."""
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    if subprocess.run(["chattr", "+i", str(workdir / "checkpoints")], capture_output=True).returncode:
        pytest.skip("this filesystem has no immutable flag")
    try:
        out = run_cmd(
            cli(workdir, "--config.iterations=1", "--config.checkpoint.every=1", *QUICK), FAULT_TIMEOUT
        )
    finally:
        subprocess.run(["chattr", "-i", str(workdir / "checkpoints")])
    assert out.returncode == exit_codes.USAGE, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and "Operation not permitted" in lines[0], lines


# ----------------------------------------------------------------------------------------------------
# interrupts


@pytest.mark.slow  # a whole tiny run in a subprocess, interrupted
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_is_one_line_that_says_how_to_resume(tmp_path, sig):
    workdir = tmp_path / "run"
    args = cli(workdir, "--config.iterations=3", "--config.checkpoint.every=1", *QUICK)
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + FAULT_TIMEOUT
    while time.time() < deadline and not (workdir / "checkpoints" / "1").is_dir():
        time.sleep(0.2)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr[-3000:]
    lines = error_lines(stderr)
    assert len(lines) == 1 and signal.Signals(sig).name in lines[0], lines
    assert "run the same command to resume" in lines[0]
    assert not (workdir / LOCK_FILE).exists()
    resumed = run_cmd(args, FAULT_TIMEOUT)
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------
# episodes lost to the environment


def retriever_down_pool(tmp_path, n: int = 3):
    """Search QA's generated questions, each answered by an HTTP retriever on a port nothing listens on."""
    import dataclasses

    from roleagent_jax.envs import get_family
    from roleagent_jax.envs.base import TaskPool

    family = get_family("search_qa")
    pool = family.task_pool("gen_test", gen_dir=tmp_path / "games", n=n, seed=0, options={})
    down = ("http", "http://127.0.0.1:9/retrieve", "queries")
    tasks = [
        dataclasses.replace(t, payload=dataclasses.replace(t.payload, retriever=down)) for t in pool.tasks
    ]
    return family, TaskPool(tasks, pool.source)


def test_a_retriever_outage_loses_episodes_it_does_not_count_as_the_agents(tmp_path):
    from roleagent_jax.evaluation.panel import ExpertPolicy, evaluate_trajectories, summarize

    family, pool = retriever_down_pool(tmp_path)
    trajs = evaluate_trajectories(ExpertPolicy(family), family, pool, num_workers=1, max_steps=4)
    assert all(t.env_failed and "retrieval server" in t.env_error for t in trajs)
    summary = summarize("gen_test", trajs, family.task_types, family.score_name, pool, family)
    assert (summary["n"], summary["lost"], summary["lost_share"]) == (0, 3, 1.0)
    assert summary["wins"] == [None] * 3 and len(summary["failed_games"]) == 3


def test_evaluation_exits_3_when_more_than_the_set_share_is_lost(tmp_path, monkeypatch, capsys):
    from roleagent_jax.evaluation import cli as evaluate
    from roleagent_jax.types import Trajectory

    def half_lost(policy, family, pool, **kwargs):
        n = kwargs.get("limit") or len(pool)
        return [Trajectory(i, pool[i].type, pool[i].goal, won=i % 2 == 1, env_failed=i % 2 == 0,
                           env_error="RetrieverUnavailable: down") for i in range(n)]  # fmt: skip

    monkeypatch.setattr(evaluate, "evaluate_trajectories", half_lost)
    argv = ["--env=search_qa", "--policy=random", "--split=gen_test", "--gen-n=4", f"--gen-dir={tmp_path}"]
    summary = evaluate.main([*argv, "--max-lost-share=0.5", "--quiet"])  # 2 of 4 lost: at the limit
    assert (summary["n"], summary["lost"], summary["success"]) == (2, 2, 1.0)
    with pytest.raises(SystemExit) as exit_:
        evaluate.main([*argv, "--max-lost-share=0.25", "--quiet"])
    assert exit_.value.code == exit_codes.ENV_OUTAGE
    err = error_lines(capsys.readouterr().err)
    assert err[-1].startswith(
        "error: 2 of 4 episodes were lost to the environment, more than --max-lost-share"
    )


def test_a_retriever_that_finds_nothing_for_every_query_is_flagged():
    from roleagent_jax.envs import get_family
    from roleagent_jax.types import Step, Trajectory

    family = get_family("search_qa")

    def searched(found: bool) -> Trajectory:
        obs = (
            "<information>Doc 1(Title: T) text</information>"
            if found
            else "<information>No results.</information>"
        )
        step = Step("q", None, "<search>x</search>", "x", True, 0.0, obs, False)
        return Trajectory(0, "bridge", "q", steps=[step, step])

    assert family.warnings([searched(False)] * 2) == [
        "the retriever returned no passage for any of 4 searches: check its index and corpus (retriever_url, corpus)"
    ]
    assert family.warnings([searched(False), searched(True)]) == []  # some queries found something
    assert family.warnings([searched(False)]) == []  # two empty searches may be two bad queries


@pytest.mark.slow  # a whole tiny run (or two) in a subprocess
def test_an_iteration_that_loses_too_many_episodes_stops_and_lost_rows_are_not_trained(tmp_path, monkeypatch):
    """Training: a lost episode's steps are no PPO rows; past env.max_lost_share the iteration stops the
    run (EnvironmentOutage, exit 3) before its update, so the last checkpoint stays the run's state."""
    from test_trainer import tiny_config

    from roleagent_jax.envs.pool import EnvPool
    from roleagent_jax.run import trainer as trainer_module

    config = tiny_config(tmp_path / "run", iterations=1)
    step = EnvPool.step
    lose = {"slots": {0}}

    def failing_step(self, actions):
        out = step(self, actions)
        for slot in lose["slots"] & set(out):
            out[slot] = EnvPool._failed("RetrieverUnavailable: down")
        return out

    monkeypatch.setattr(EnvPool, "step", failing_step)
    trained = []
    update = trainer_module.Trainer._update
    monkeypatch.setattr(
        trainer_module.Trainer,
        "_update",
        lambda self, rows, adv, it: trained.append(rows) or update(self, rows, adv, it),
    )
    t = trainer_module.Trainer(config)
    try:
        t.warm_start()
        t.iteration(0)  # one of four episodes lost: within the share
        assert trained and all(r.traj_id != 0 for r in trained[-1])
        lose["slots"] = {0, 1, 2}
        params = t.state.params
        with pytest.raises(exit_codes.EnvironmentOutage, match="lost 3 of 4 episodes"):
            t.iteration(1)
        assert t.state.params is params and len(trained) == 1
    finally:
        t.close()


# ----------------------------------------------------------------------------------------------------
# pool sizes


def test_more_tasks_per_iteration_than_the_training_pool_is_refused_before_any_work(tmp_path):
    out = run_cmd(cli(tmp_path / "run", "--config.rollout.tasks_per_iter=12", *QUICK), 300)
    assert out.returncode == exit_codes.USAGE, out.stderr[-3000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and "--config.rollout.tasks_per_iter=12" in lines[0], lines
    assert "--config.env.gen.n_train) holds 4" in lines[0]
    assert not (tmp_path / "run").exists()
