"""A real training process SIGKILLed inside each phase of a run, then the same command again: the run
resumes and ends exactly where an uninterrupted one does (final weights, every metric, AIW state).

The kills come from tests/kill_in_phase.py, which wraps the phase's function and runs the CLI. All the
tests share one uninterrupted reference run of the same command. All are slow (`pytest -m slow`); the
default suite keeps one kill: tests/test_bad_inputs.py's killed warm start.
"""

import json
import signal
import sys
from pathlib import Path

import pytest
from test_trainer import cli, run_cmd

KILLER = Path(__file__).resolve().parent / "kill_in_phase.py"
ARGS = (
    "--config.iterations=2",
    "--config.checkpoint.every=1",
    "--config.env.eval_splits=()",
    "--config.warmstart.steps=4",
    "--config.warmstart.checkpoint_every=2",
    "--config.loss.kl_type=low_var_kl",  # the KL reference (the warm-started model) must survive a kill
    "--config.loss.kl_coef=0.02",
    "--config.log.progress=false",
    "--config.log.tensorboard=false",
)
# wall-clock figures differ between any two runs; a resumed process compiles the sampler's programs anew
VOLATILE = ("time/", "rollout/tokens_per_s", "rollout/compilations")
TIMEOUT = 1800


def train(workdir: Path):
    out = run_cmd(cli(workdir, *ARGS), TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def kill_in(phase: str, at: int, workdir: Path) -> str:
    """Run the command until it kills itself in `phase`; returns its stderr."""
    args = cli(workdir, *ARGS)
    assert args[1:3] == ["-m", "roleagent_jax.main"]
    out = run_cmd([sys.executable, str(KILLER), phase, str(at), *args[3:]], TIMEOUT)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr[-3000:])
    assert "kill_in_phase: SIGKILL" in out.stderr
    return out.stderr


def metric_lines(workdir: Path) -> list[dict]:
    lines = (workdir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)} for line in lines]


def final_host(workdir: Path) -> dict:
    """The last RL checkpoint's host state (AIW sampler logits and RNG, AIW history, failure-memory
    extent, sampled tasks, warm-start losses) without what names the folder or the clock."""
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    host = json.loads((workdir / "checkpoints" / str(steps[-1]) / "host" / "metadata").read_text())
    host.pop("history")  # the metrics, compared from logs/metrics.jsonl
    host["aiw"]["memory"].pop("path")
    return host


def memory_records(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "failure_memory.jsonl").read_text().splitlines()]


def rl_steps(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same command, never interrupted."""
    workdir = tmp_path_factory.mktemp("reference") / "run"
    train(workdir)
    return workdir


def resume_and_compare(workdir: Path, reference: Path, resumed_from: str) -> None:
    """The same command again: it says where it resumed and ends exactly where the reference did."""
    out = train(workdir)
    assert resumed_from in out.stdout, out.stdout[-3000:]
    a = (reference / "hf_final" / "model.safetensors").read_bytes()
    b = (workdir / "hf_final" / "model.safetensors").read_bytes()
    assert a == b
    metrics = metric_lines(workdir)
    assert [m["step"] for m in metrics] == [1, 2]  # each iteration once
    assert metrics == metric_lines(reference)
    assert final_host(workdir) == final_host(reference)
    assert memory_records(workdir) == memory_records(reference)


@pytest.mark.slow
def test_a_kill_in_the_warm_start_resumes_exactly(tmp_path, reference):
    workdir = tmp_path / "run"
    kill_in("warmstart", 3, workdir)
    assert not rl_steps(workdir)
    warm = workdir / "warmstart_checkpoints"
    assert sorted(int(p.name) for p in warm.iterdir() if p.name.isdigit()) == [2]  # step 3 was lost
    resume_and_compare(workdir, reference, f"warm start: resumed from {warm} at step 2 of 4")


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["rollout", "update"])
def test_a_kill_in_a_rollout_or_an_update_resumes_exactly(tmp_path, reference, phase):
    workdir = tmp_path / "run"
    kill_in(phase, 2, workdir)
    assert rl_steps(workdir) == [1]
    resume_and_compare(workdir, reference, f"resumed from {workdir / 'checkpoints'} at iteration 1")


@pytest.mark.slow
def test_a_kill_in_an_aiw_round_resumes_exactly(tmp_path, reference):
    """The killed round's failure records are on disk, its sampler update is not: the resumed run must
    drop those records and redo the round."""
    workdir = tmp_path / "run"
    kill_in("aiw", 2, workdir)
    assert rl_steps(workdir) == [1]
    assert {r["iteration"] for r in memory_records(workdir)} == {0, 1}
    resume_and_compare(workdir, reference, f"resumed from {workdir / 'checkpoints'} at iteration 1")


@pytest.mark.slow
def test_a_kill_while_a_checkpoint_is_written_resumes_exactly(tmp_path, reference):
    """Killed with checkpoint step 2 in orbax's temporary folder, after iteration 2 logged its metrics and
    appended its failure records: the resumed run ignores the half-made step, drops that metrics line
    and those records, and redoes iteration 2 from step 1."""
    workdir = tmp_path / "run"
    kill_in("checkpoint", 2, workdir)
    assert rl_steps(workdir) == [1]
    assert [p.name for p in (workdir / "checkpoints").iterdir() if p.name.startswith("2.")]  # half-made
    assert [m["step"] for m in metric_lines(workdir)] == [1, 2]
    assert {r["iteration"] for r in memory_records(workdir)} == {0, 1}
    resume_and_compare(workdir, reference, f"resumed from {workdir / 'checkpoints'} at iteration 1")
