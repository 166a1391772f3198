"""ALFWorld games on disk: task types, goal sentences, data folders and the task pools built from them.

Light on purpose (no textworld): the trainer reads task pools in the main process, and the engine
(`engine.py`) is only imported where games are played.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import OrderedDict
from pathlib import Path

from roleagent_jax.envs.base import Task, TaskPool

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
WIN_REWARD = 10.0
GOAL_PREFIX = "Your task is to: "
GAME_FILE = "game.tw-pddl"
DATA_SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")  # alfworld-download's json_2.1.1
GEN_POOLS = {"gen_seen": "seen", "gen_unseen": "unseen"}  # generated split -> combination pool


def task_type_of(game_file: str | os.PathLike) -> str:
    """Task type from the folder layout `<task_type>-<Obj>-<Mrecep>-<Recep>-<scene>/<trial>/game.tw-pddl`."""
    name = Path(game_file).parent.parent.name.split("-", 1)[0]
    if name not in TASK_TYPES:
        raise ValueError(
            f"cannot tell the task type of {game_file}: folder prefix {name!r} is not one of {TASK_TYPES}"
        )
    return name


def goal_of(game_data: dict) -> str:
    """The task sentence as the intro will show it, read from the game's grammar without loading it."""
    grammar = game_data.get("grammar", "")
    start = grammar.find(GOAL_PREFIX)
    if start < 0:
        return ""
    start += len(GOAL_PREFIX)
    end = grammar.find('"', start)
    return grammar[start:end].strip()


def goal_from_observation(obs: str) -> str:
    """The task sentence from an intro observation ('' when the text has none)."""
    start = obs.find(GOAL_PREFIX)
    if start < 0:
        return ""
    return obs[start + len(GOAL_PREFIX) :].strip().splitlines()[0].strip()


def split_dir(data_dir: str | os.PathLike | None, split: str) -> Path:
    """Locate `<data>/json_2.1.1/<split>` (or `<data>/<split>`), with a message saying how to get the data."""
    root = data_dir or os.environ.get("ALFWORLD_DATA")
    hint = (
        "ALFWorld games are not bundled. Run `alfworld-download` (from the alfworld package), then set "
        "$ALFWORLD_DATA to the folder it filled (the one holding json_2.1.1/) or pass --data=DIR. "
        "The procedurally generated splits (gen_seen, gen_unseen) need no download."
    )
    if not root:
        raise FileNotFoundError(f"no ALFWorld data folder given for split {split!r}. {hint}")
    root = Path(os.path.expandvars(str(root))).expanduser()
    for cand in (root / "json_2.1.1" / split, root / split):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(
        f"split {split!r} not found under {root} (looked for json_2.1.1/{split} and {split}). {hint}"
    )


class LRU(OrderedDict):
    """A small least-recently-used map: per-process caches must not grow with the 3,553 train games."""

    def __init__(self, maxsize: int):
        super().__init__()
        self.maxsize = maxsize

    def get_or_make(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        if len(self) > self.maxsize:
            self.popitem(last=False)
        return value


JSON_CACHE = LRU(256)


def read_json(path: str) -> dict:
    """A game file's JSON, cached per process by (path, mtime, size)."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)

    def make():
        with open(path) as f:
            return json.load(f)

    return JSON_CACHE.get_or_make(key, make)


ON_CORRUPT = ("fail", "skip")


def list_games(folder: str | os.PathLike, on_corrupt: str = "fail") -> list[str]:
    """Sorted playable game files under a folder, filtered the way alfworld's own loader filters them.

    A game file that is not readable JSON raises ValueError naming it (`on_corrupt="fail"`), or is left
    out with a warning naming it (`"skip"`): one bad download should not cost a whole split silently."""
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt={on_corrupt!r}: must be one of {', '.join(ON_CORRUPT)}")
    games = []
    for path in sorted(Path(folder).rglob(GAME_FILE)):
        text = str(path)
        if "movable" in text or "Sliced" in text:
            continue
        try:
            data = read_json(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            message = f"corrupt game file {text}: {err}"
            if on_corrupt == "fail":
                raise ValueError(f"{message} (skip such files with on_corrupt=skip)") from err
            warnings.warn(f"skipped {message}", stacklevel=2)
            continue
        if not data.get("solvable", False):
            continue
        games.append(text)
    return games


def default_gen_dir() -> Path:
    """Where generated games go unless told otherwise ($ROLEAGENT_GEN_DIR or ~/.cache/roleagent_jax/games)."""
    env = os.environ.get("ROLEAGENT_GEN_DIR")
    return Path(env) if env else Path.home() / ".cache" / "roleagent_jax" / "games"


def game_task(game_file: str, expert_plan: list[str] | None = None) -> Task:
    """The Task of one game file: its path is both id and payload."""
    plan = tuple(expert_plan) if expert_plan is not None else None
    return Task(game_file, task_type_of(game_file), goal_of(read_json(game_file)), game_file, plan)


def pool_from_files(
    files: list[str], source: str = "", plans: dict[str, list[str]] | None = None
) -> TaskPool:
    """Games in sorted order (their indices are the task ids); `plans` maps a file to its known plan."""
    files = sorted(str(f) for f in files)
    if not files:
        raise FileNotFoundError(f"no playable game.tw-pddl files in {source or 'the given list'}")
    plans = plans or {}
    return TaskPool([game_task(f, plans.get(f)) for f in files], source)


def pool_from_dir(folder: str | os.PathLike, on_corrupt: str = "fail") -> TaskPool:
    """Every playable game under `folder` (see `list_games` for `on_corrupt`)."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"game folder not found: {folder}")
    return pool_from_files(list_games(folder, on_corrupt), source=str(folder))


def pool_from_split(data_dir: str | os.PathLike | None, split: str, on_corrupt: str = "fail") -> TaskPool:
    """A real ALFWorld split, e.g. valid_seen, from `data_dir` (None: $ALFWORLD_DATA)."""
    return pool_from_dir(split_dir(data_dir, split), on_corrupt)
