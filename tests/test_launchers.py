"""The launchers in --dry-run mode print the gcloud / python commands they would run (no gcloud needed)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def launch(script: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        ["bash", str(REPO / "launchers" / script), *args], capture_output=True, text=True, env=env, timeout=60
    )
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def commands(out: subprocess.CompletedProcess) -> list[list[str]]:
    """The printed `+ cmd args...` lines (stdout and stderr), split as the shell would."""
    lines = (out.stdout + out.stderr).splitlines()
    return [shlex.split(line[2:]) for line in lines if line.startswith("+ ")]


def gcloud(cmds: list[list[str]], verb: str) -> list[list[str]]:
    return [c for c in cmds if c[:4] == ["gcloud", "compute", "tpus", "tpu-vm"] and c[4] == verb]


def remote(cmd: list[str]) -> str:
    return cmd[cmd.index("--command") + 1]


def test_tpu_multihost_spot_run_with_bucket_and_model():
    out = launch(
        "tpu_vm.sh",
        "--dry-run",
        "--name",
        "ra",
        "--zone",
        "us-central2-b",
        "--project",
        "p1",
        "--accelerator",
        "v4-32",
        "--spot",
        "--bucket",
        "gs://bk/runs",
        "--hf-model",
        "Qwen/Qwen2.5-1.5B-Instruct",
        "--",
        "--config.iterations=150",
        "--config.rollout.group_size=8",
    )
    cmds = commands(out)
    describe, create = cmds[0], cmds[1]
    assert describe[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "describe"]
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "ra"]
    assert "--spot" in create and create[create.index("--accelerator-type") + 1] == "v4-32"
    assert create[create.index("--version") + 1] == "tpu-ubuntu2204-base"
    assert create[create.index("--project") + 1] == "p1"
    ssh = gcloud(cmds, "ssh")
    assert ssh and all("--worker=all" in c for c in ssh)
    setup = " ".join(remote(c) for c in ssh[:-1])
    assert "pip install -q -e . 'jax[tpu]==0.10.2'" in setup
    assert "alfworld-download" in setup
    assert (
        "huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir $HOME/models/Qwen2.5-1.5B-Instruct"
        in setup
    )
    assert "gcsfuse --implicit-dirs --only-dir runs bk /mnt/roleagent" in setup
    train = remote(ssh[-1])
    assert "ROLEAGENT_DISTRIBUTED=auto" in train  # v4-32: 4 workers
    assert "python -m roleagent_jax.main --config=configs/alfworld.py" in train
    assert "--config.workdir=/mnt/roleagent/ra" in train
    assert "--config.model.path=$HOME/models/Qwen2.5-1.5B-Instruct" in train
    assert train.index("--config.iterations=150") < train.index("--config.rollout.group_size=8")
    assert "training on 4 worker(s)" in out.stderr


def test_tpu_single_host_copies_checkout_and_quotes_args():
    out = launch(
        "tpu_vm.sh",
        "--dry-run",
        "--name",
        "one",
        "--zone",
        "z",
        "--accelerator",
        "v5litepod-8",
        "--workdir",
        "/nfs/run1",
        "--",
        "--config.env.eval_splits=('valid_seen',)",
    )
    cmds = commands(out)
    create = gcloud(cmds, "create")[0]
    assert create[create.index("--version") + 1] == "v2-alpha-tpuv5-lite"
    scp = gcloud(cmds, "scp")[0]
    assert "--worker=all" in scp
    train = remote(gcloud(cmds, "ssh")[-1])
    assert "ROLEAGENT_DISTRIBUTED" not in train  # one host
    assert "--config.workdir=/nfs/run1" in train
    # The remote shell receives the trainer argument intact.
    inner = shlex.split(train.split("roleagent_jax.main", 1)[1].split("2>&1")[0])
    assert "--config.env.eval_splits=('valid_seen',)" in inner


def test_tpu_paths_with_spaces_reach_the_trainer_intact():
    """--workdir, --model-path and --config go into the remote shell command quoted."""
    out = launch(
        "tpu_vm.sh", "--dry-run", "--name", "one", "--zone", "z", "--accelerator", "v5litepod-8",
        "--workdir", "/nfs/my runs/run 1", "--model-path", "/models/Qwen 1.5B", "--config", "configs/my config.py",
    )  # fmt: skip
    train = remote(gcloud(commands(out), "ssh")[-1])
    inner = shlex.split(train.split("roleagent_jax.main", 1)[1].split("2>&1")[0])
    assert "--config.workdir=/nfs/my runs/run 1" in inner
    assert "--config.model.path=/models/Qwen 1.5B" in inner
    assert "--config=configs/my config.py" in inner


def test_gpu_launcher_does_not_restart_a_run_refused_with_exit_2(tmp_path):
    """Exit 2 (a refusal, a full disk, a workdir in use) fails the same way on every rerun."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho run >> "$(dirname "$0")/runs"\nexit 2\n')
    fake.chmod(0o755)
    data = tmp_path / "alfworld"
    (data / "json_2.1.1").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"ALFWORLD_DATA": str(data)}
    out = subprocess.run(
        ["bash", str(REPO / "launchers" / "gpu.sh"), "--gpus", "1", "--python", str(fake), "--max-restarts", "3",
         "--log", str(tmp_path / "log.txt")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert (tmp_path / "runs").read_text().count("run") == 1 and "not restarting" in out.stderr


def test_tpu_repo_clone_and_errors():
    out = launch(
        "tpu_vm.sh",
        "--dry-run",
        "--name",
        "r",
        "--zone",
        "z",
        "--repo",
        "https://example.com/x.git",
        "--branch",
        "v1",
        "--setup-only",
    )
    clone = [remote(c) for c in gcloud(commands(out), "ssh")][0]
    assert "git clone --depth 1 --branch v1 https://example.com/x.git" in clone
    assert not any("roleagent_jax.main" in remote(c) for c in gcloud(commands(out), "ssh"))
    assert "--help" in launch("tpu_vm.sh", "--help").stdout
    for args, msg in [
        ((), "--name is required"),
        (("--name", "a"), "--zone is required"),
        (("--name", "a", "--zone", "z", "--bucket", "s3://x"), "gs://"),
        (("--name", "a", "--zone", "z", "--bogus"), "unknown option"),
    ]:
        bad = launch("tpu_vm.sh", "--dry-run", *args, ok=False)
        assert bad.returncode == 2 and msg in bad.stderr


def test_gpu_launcher_sets_mesh_and_xla_env():
    out = launch(
        "gpu.sh",
        "--dry-run",
        "--gpus",
        "4",
        "--mesh",
        "1,2,2",
        "--model-path",
        "/m/Qwen2.5-1.5B-Instruct",
        "--workdir",
        "runs/q15",
        "--install",
        "--",
        "--config.iterations=3",
    )
    env = dict(
        line[len("export ") :].split("=", 1) for line in out.stdout.splitlines() if line.startswith("export ")
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in env["XLA_FLAGS"]
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.92"
    cmds = commands(out)
    assert cmds[0] == ["python3", "-m", "pip", "install", "-e", ".", "jax[cuda12]==0.10.2"]
    main = cmds[-1]
    assert main[1:4] == ["-m", "roleagent_jax.main", "--config=configs/alfworld.py"]
    for arg in (
        "--config.mesh.data=1",
        "--config.mesh.fsdp=2",
        "--config.mesh.tensor=2",
        "--config.workdir=runs/q15",
        "--config.model.path=/m/Qwen2.5-1.5B-Instruct",
        "--config.iterations=3",
    ):
        assert arg in main


@pytest.mark.parametrize(
    "args,msg",
    [
        (("--gpus", "4", "--mesh", "1,3,1"), "uses 3 devices"),
        (
            (
                "--gpus",
                "0",
            ),
            "positive",
        ),
        (("--gpus", "2", "--mesh", "2,x,1"), "three"),
    ],
)
def test_gpu_launcher_rejects_bad_mesh(args, msg):
    bad = launch("gpu.sh", "--dry-run", *args, ok=False)
    assert bad.returncode == 2 and msg in bad.stderr


def test_gpu_default_mesh_is_fsdp_over_all_gpus():
    main = commands(launch("gpu.sh", "--dry-run", "--gpus", "8"))[-1]
    assert "--config.mesh.fsdp=8" in main and "--config.mesh.data=1" in main
