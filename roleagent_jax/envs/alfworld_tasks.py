"""The task pool: the sorted list of games whose indices are the task ids everything else refers to."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from roleagent_jax.envs.alfworld import _read_json, goal_of, list_games, split_dir, task_type_of

GEN_SPLITS = {"gen_seen": "seen", "gen_unseen": "unseen"}


def default_gen_dir() -> Path:
    """Where generated games go unless told otherwise ($ROLEAGENT_GEN_DIR or ~/.cache/roleagent_jax/games)."""
    env = os.environ.get("ROLEAGENT_GEN_DIR")
    return Path(env) if env else Path.home() / ".cache" / "roleagent_jax" / "games"


@dataclass
class TaskPool:
    """Games in a fixed (sorted) order with their task types and task sentences.

    The index of a game in `game_files` is its task id: the AIW sampler draws these ids and
    `EnvPool.reset` plays exactly the game it is given.
    """

    game_files: list[str]
    task_types: list[str]
    goals: list[str]
    source: str = ""
    expert_plans: dict[int, list[str]] = field(default_factory=dict)  # known solutions (generated games)

    def __post_init__(self):
        if not (len(self.game_files) == len(self.task_types) == len(self.goals)):
            raise ValueError("game_files, task_types and goals must have the same length")

    def __len__(self) -> int:
        return len(self.game_files)

    def type_counts(self) -> dict[str, int]:
        return dict(Counter(self.task_types))

    def subset(self, ids: list[int]) -> TaskPool:
        plans = {j: self.expert_plans[i] for j, i in enumerate(ids) if i in self.expert_plans}
        return TaskPool(
            [self.game_files[i] for i in ids],
            [self.task_types[i] for i in ids],
            [self.goals[i] for i in ids],
            self.source,
            plans,
        )

    @classmethod
    def from_files(cls, files: list[str], source: str = "") -> TaskPool:
        files = sorted(str(f) for f in files)
        if not files:
            raise FileNotFoundError(f"no playable game.tw-pddl files in {source or 'the given list'}")
        return cls(files, [task_type_of(f) for f in files], [goal_of(_read_json(f)) for f in files], source)

    @classmethod
    def from_dir(cls, folder: str | os.PathLike) -> TaskPool:
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"game folder not found: {folder}")
        return cls.from_files(list_games(folder), source=str(folder))

    @classmethod
    def from_split(cls, data_dir: str | os.PathLike | None, split: str) -> TaskPool:
        """A real ALFWorld split, e.g. valid_seen, from `data_dir` (None: $ALFWORLD_DATA)."""
        return cls.from_dir(split_dir(data_dir, split))

    @classmethod
    def generated(cls, out_dir: str | os.PathLike, n: int, seed: int, pool: str = "seen", **size) -> TaskPool:
        """n procedurally generated games (reused when out_dir already holds the same set).

        `size` takes procgen.GenSize fields: num_receptacles, num_objects, extra_targets (int or
        (lo, hi)), max_expert_steps. Different settings go to different sub-folders of out_dir.
        """
        from roleagent_jax.envs import procgen  # the generator is only needed here

        gen_size = procgen.GenSize(**size)
        tag = hashlib.sha1(json.dumps(asdict(gen_size), sort_keys=True).encode()).hexdigest()[:8]
        folder = Path(out_dir) / f"{pool}_n{n}_seed{seed}_{tag}"
        made = procgen.generate(folder, n, seed, pool, gen_size)
        result = cls.from_files(made.game_files, source=str(folder))
        root = Path(folder)
        plans = made.manifest.get("expert_plans", {})
        result.expert_plans = {
            i: plans[str(Path(f).relative_to(root))]
            for i, f in enumerate(result.game_files)
            if str(Path(f).relative_to(root)) in plans
        }
        return result

    @classmethod
    def for_split(
        cls,
        split: str,
        data_dir: str | os.PathLike | None = None,
        *,
        gen_dir: str | os.PathLike | None = None,
        gen_n: int = 24,
        gen_seed: int = 0,
        **size,
    ) -> TaskPool:
        """Any split by name: gen_seen / gen_unseen are generated, anything else is real ALFWorld data."""
        if split in GEN_SPLITS:
            return cls.generated(gen_dir or default_gen_dir(), gen_n, gen_seed, GEN_SPLITS[split], **size)
        return cls.from_split(data_dir, split)
