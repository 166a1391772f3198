"""Test session set-up: a fake 8-device CPU mesh, and the location of the shared ALFWorld data."""

import os

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


@pytest.fixture(scope="session")
def alfworld_data() -> Path:
    path = shared_alfworld_dir()
    if path is None:
        pytest.skip(
            "real ALFWorld games not found: set $ALFWORLD_DATA or place them in ../shared/data/alfworld"
        )
    return path
