"""Convert a GGUF file into an ordinary Hugging Face checkpoint directory.

    python -m roleagent_jax.models.convert --gguf=FILE --out=DIR

DIR receives ``config.json``, ``model.safetensors`` (float32), ``tokenizer.json``,
``tokenizer_config.json`` (with the chat template) and ``generation_config.json``; every other path
(training, evaluation, transformers itself) then reads it like any checkpoint. Everything is written
into a temporary sibling folder that is renamed into place at the end, so a failed conversion leaves
nothing in DIR. A bad file or argument prints one line naming it and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from roleagent_jax.models.gguf_import import GGUFError, check_gguf_path, read_gguf
from roleagent_jax.models.gguf_tokenizer import build_tokenizer
from roleagent_jax.models.hf_io import save_tensors, umask_mode
from roleagent_jax.models.tokenizer import eos_ids


def _generation_config(tok) -> dict:
    ids = eos_ids(tok)
    return {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": ids[0] if len(ids) == 1 else ids,
        "pad_token_id": tok.pad_token_id,
    }


def _staging_folder(out: Path) -> tuple[Path, list[Path]]:
    """A hidden sibling of ``out`` to write into (renamed into place when complete), with the mode of
    any new folder, and the folders above it made for it (removed again if the conversion fails); a
    folder that cannot be written names ``out``, not the hidden one."""
    made = [p for p in out.absolute().parents if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        _remove_empty(made)
        raise OSError(f"{out}: cannot create it ({err.strerror or err})") from err
    umask_mode(tmp)
    return tmp, made


def _remove_empty(folders: list[Path]) -> None:
    """The folders a failed conversion made, deepest first, where nothing else was put in them."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def convert(gguf: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the Hugging Face directory ``out`` from the GGUF file ``gguf``; returns ``out``.

    Raises GGUFError (a ValueError) naming the file, or FileExistsError when ``out`` is not empty.
    ``out`` appears only once complete.
    """
    gguf, out = Path(gguf).expanduser(), Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: already exists and is not an empty folder")
    check_gguf_path(gguf)
    tmp, made = _staging_folder(out)  # before the file is read: an unwritable folder fails at once
    try:
        model = read_gguf(gguf)
        tok = build_tokenizer(model.metadata, gguf)
        (tmp / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
        save_tensors(model.tensors, tmp / "model.safetensors")
        tok.save_pretrained(str(tmp), save_jinja_files=False)  # the template inside tokenizer_config.json
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(tok), indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(made)
        raise
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m roleagent_jax.models.convert", description=__doc__.split("\n")[0]
    )
    p.add_argument("--gguf", required=True, help="the GGUF file (llama or qwen2 architecture)")
    p.add_argument("--out", required=True, help="the Hugging Face directory to create (absent or empty)")
    args = p.parse_args(argv)
    try:
        out = convert(args.gguf, args.out)
    except (GGUFError, FileExistsError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
