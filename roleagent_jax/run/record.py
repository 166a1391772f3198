"""Which run a workdir belongs to: `run.json`, written when a run first claims the folder.

A workdir's checkpoints, games, tokenizer and exported models only mean something under the settings
that made them. Resuming with another config file, family, model or tokenizer (or any key that changes
what was trained) would silently mix two runs, so such a resume is refused before anything is written.
The keys in `RESUMABLE` may change on a resume (docs/scaling.md lists them): they say how long to
run, how to evaluate, log and checkpoint, or where and how fast it runs, not what is learned.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ml_collections import ConfigDict

from roleagent_jax.config import CONFIG, PATH_KEYS
from roleagent_jax.config.schema import family_options, lookup
from roleagent_jax.envs.registry import get_family
from roleagent_jax.run.checkpointing import claim_workdir, write_json
from roleagent_jax.run.lock import WorkdirLock, check_free

RUN_FILE = "run.json"
# Dotted keys, or sections (every key under them), that a resumed run may set differently.
RESUMABLE = (
    "workdir",
    "iterations",
    "eval",
    "log",
    "checkpoint",
    "mesh",
    "model.required",
    "model.remat",
    "env.data_dir",
    "env.data_required",
    "env.on_corrupt",
    "env.eval_splits",
    "env.num_workers",
    "env.step_timeout",
    "env.max_lost_share",
    "env.gen.dir",
    "rollout.backend",
    "rollout.max_rows_per_call",
    "train.micro_batch_rows",
    "warmstart.checkpoint_every",
    "aiw.eta",
    "aiw.decay",
    "aiw.temperature",
    "aiw.epsilon",
    "aiw.cap",
)
SHOWN = 3  # differences named in the refusal (what defines a run first); the rest are counted
FIRST = ("env.name", "model.path", "tokenizer.path", "algo")


def run_record(config: ConfigDict, config_file: str = "") -> dict:
    """What defines the run of `config`: the config file it came from, every declared key not in
    `RESUMABLE` and the selected family's own options (paths absolute), as JSON holds them."""
    keys = {dotted: lookup(config, dotted) for dotted, _ in CONFIG.keys() if not _resumable(dotted)}
    family = get_family(config.env.name)
    keys |= {f"env.{family.name}.{name}": value for name, value in family_options(config, family).items()}
    for dotted in PATH_KEYS:
        if keys.get(dotted):
            keys[dotted] = str(Path(keys[dotted]).absolute())
    keys = {k: v.to_dict() if isinstance(v, ConfigDict) else v for k, v in keys.items()}
    file = str(Path(config_file).absolute()) if config_file else ""
    return json.loads(json.dumps({"config_file": file, "config": keys}))


def check_resume(workdir: Path, record: dict) -> None:
    """ValueError in one line when `workdir` already belongs to a run whose record differs from `record`
    (a workdir from before records existed is taken as this run's)."""
    path = workdir / RUN_FILE
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        earlier = saved["config"]
        if not isinstance(earlier, Mapping):
            raise TypeError("config is not a mapping")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a run record ({' '.join(str(err).split())}); delete it") from err
    now = record["config"]
    # A key declared after the earlier run started is not in its record: that run played its default.
    declared = {k: json.loads(json.dumps(key.default)) for k, key in CONFIG.keys() if k in now}
    earlier = {**declared, **earlier}
    differ = [
        f"{key}={now.get(key)!r} (its run: {earlier.get(key)!r})"
        for key in sorted(set(now) | set(earlier), key=_order)
        if now.get(key) != earlier.get(key)
    ]
    if not differ:
        return
    more = f" and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
    started = f" (started with --config={saved['config_file']})" if saved.get("config_file") else ""
    raise ValueError(
        f"--config.workdir={str(workdir)!r} holds another run{started}: {', '.join(differ[:SHOWN])}{more}; "
        "resume it with its own settings, choose a new --config.workdir, or add "
        "--config.checkpoint.resume=False --config.checkpoint.overwrite=True to move it aside"
    )


def open_workdir(workdir: Path, config: ConfigDict, config_file: str, is_main: bool) -> WorkdirLock | None:
    """Claim `workdir` for the run of `config`: refused when it holds another run (unless
    `checkpoint.overwrite` moves that one aside), when another live run holds its lock (`lock`), or when it
    cannot be made; process 0 takes the lock and writes the record. Returns the lock (None elsewhere)."""
    c = config
    record = run_record(c, config_file)
    if not c.checkpoint.overwrite:
        check_resume(workdir, record)
    check_free(workdir)  # a workdir another live run holds is neither resumed nor moved aside
    claim_workdir(workdir, c.checkpoint.resume, c.checkpoint.overwrite)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--config.workdir={c.workdir!r}: cannot make it ({err.strerror or err})") from err
    if not is_main:
        return None
    lock = WorkdirLock(workdir)
    write_record(workdir, record)
    return lock


def write_record(workdir: Path, record: dict) -> None:
    """The record into `workdir`, once: a resumed run keeps the first one."""
    if not (workdir / RUN_FILE).is_file():
        write_json(workdir / RUN_FILE, record)


def _order(key: str) -> tuple:
    return (FIRST.index(key), "") if key in FIRST else (len(FIRST), key)


def _resumable(dotted: str) -> bool:
    return any(dotted == key or dotted.startswith(key + ".") for key in RESUMABLE)
