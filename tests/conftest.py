"""Test session set-up: a fake 8-device CPU mesh, a private folder for generated tasks, and the location
of the shared ALFWorld data."""

import os
from collections.abc import Iterator

# Must happen before JAX initialises its backends: every test sees 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def shared_alfworld_dir() -> Path | None:
    """The real ALFWorld games: $ALFWORLD_DATA, else ../shared/data/alfworld beside the repo."""
    for cand in (os.environ.get("ALFWORLD_DATA"), REPO.parent / "shared" / "data" / "alfworld"):
        if cand and (Path(cand) / "json_2.1.1").is_dir():
            return Path(cand)
    return None


@pytest.fixture(scope="session", autouse=True)
def generated_tasks_dir(tmp_path_factory) -> Iterator[Path]:
    """Tasks generated without a folder named ($ROLEAGENT_GEN_DIR, inherited by subprocesses) go to this
    session's own folder: the user's cache is shared by parallel test processes and by earlier runs."""
    folder = tmp_path_factory.mktemp("generated")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLEAGENT_GEN_DIR", str(folder))
        yield folder


@pytest.fixture(scope="session")
def alfworld_data() -> Path:
    path = shared_alfworld_dir()
    if path is None:
        pytest.skip(
            "real ALFWorld games not found: set $ALFWORLD_DATA or place them in ../shared/data/alfworld"
        )
    return path


def load_config(name: str):
    """configs/<name>.py's config, imported as the package it is (as the command line loads it)."""
    import importlib

    return importlib.import_module(f"configs.{name}").get_config()


def shrunk(config, workdir: Path, iterations: int = 1):
    """`config` sized to run through the Trainer in seconds: a 1-layer model, a small tokenizer, 2 tasks
    x 2 rollouts, 2 warm-start steps; everything else (family, protocol, algorithm) as configured."""
    c = config
    c.workdir, c.iterations = str(workdir), iterations
    c.model.init.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    c.model.init.update(num_attention_heads=2, num_key_value_heads=1)
    c.tokenizer.train_vocab_size = 400
    c.rollout.tasks_per_iter, c.rollout.group_size, c.rollout.max_response_tokens = 2, 2, 8
    c.wia.max_tokens = 8
    c.warmstart.steps, c.warmstart.batch_rows = 2, 4
    c.train.mini_batch_rows, c.train.micro_batch_rows = 8, 4
    c.log.progress = c.log.tensorboard = False
    return c
