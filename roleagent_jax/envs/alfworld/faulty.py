"""Faulty experts: the known plan of a generated game with one known mistake, as ground truth for AIW.

Each mistake rewrites the game's expert plan (skip the clean/heat/cool step, put the object in another
receptacle, name an object the room does not hold, ...) and plays it through the real episode loop as
model responses, so the trajectories look exactly like a policy's: the loop parses them, the engine
answers. The mistake's failure type is the label an analyser should give. Used by `benchmarks/aiw.py`
(precision/recall of the analysers) and the analyser's tests.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from roleagent_jax.envs.alfworld.goals import APPLIANCE_OF_TRANSFORM
from roleagent_jax.envs.base import Observation, Task, TaskPool
from roleagent_jax.envs.episodes import Move, Turn, play
from roleagent_jax.types import Trajectory

_TAKE = re.compile(r"^take (.+?) from (.+)$")
_PUT = re.compile(r"^move (.+?) to (.+)$")
_XFORM = re.compile(r"^(clean|heat|cool) (.+?) with (.+)$")
_GO = re.compile(r"^go to (.+)$")
# object kinds of ALFWorld; a game's absent object is the first of these its file never mentions
_KINDS = ("teddybear", "basketball", "kettle", "laptop", "vase", "statue", "watch", "candle", "pillow",
          "book", "apple", "mug", "egg", "cd", "spatula", "tomato")  # fmt: skip
_MALFORMED = (
    "I think I should {cmd} now.",
    "<think>next</think><action></action>",
    "<action>{cmd}</action><action>look</action>",
    "<think>I will {cmd}</think>",
)


def _kind(entity: str) -> str:
    return re.sub(r"\s*\d+$", "", entity.strip())


def _say(cmd: str) -> str:
    return f"<think>step</think><action>{cmd}</action>"


@dataclass
class Scene:
    """What a faulty expert knows when it starts: the task, its plan and the room's receptacles."""

    task: Task
    plan: list[str]
    places: list[str]  # receptacles of the room, from the first observation's "go to" commands
    max_steps: int
    rng: random.Random  # how long or how often the mistake is made, seeded by task and mistake

    def goal_recep(self) -> str | None:
        return next((m.group(2) for c in self.plan if (m := _PUT.match(c))), None)

    def other_places(self, avoid: Sequence[str] = ()) -> list[str]:
        used = {m.group(1) for c in self.plan if (m := _GO.match(c))} | set(avoid)
        return [p for p in self.places if p not in used]

    def absent_kind(self) -> str:
        text = Path(self.task.payload).read_text().lower() if self.task.payload else ""
        return next(k for k in _KINDS if k not in text)


Script = Callable[[Scene], list[str] | None]  # the responses to give, or None: mistake not applicable


def _skip_step(s: Scene) -> list[str] | None:
    """Skip the precondition: the clean/heat/cool command, or (look tasks) taking the object."""
    if s.task.type == "look_at_obj_in_light":
        return [_say(c) for c in s.plan if not _TAKE.match(c)]
    if not any(_XFORM.match(c) for c in s.plan):
        return None
    return [_say(c) for c in s.plan if not _XFORM.match(c)]


def _wrong_receptacle(s: Scene) -> list[str] | None:
    goal = s.goal_recep()
    appliances = set(APPLIANCE_OF_TRANSFORM.values())
    others = [p for p in s.other_places() if _kind(p) not in appliances and goal and _kind(p) != _kind(goal)]
    if goal is None or not others:
        return None
    out = []
    for c in s.plan:
        if c == f"open {goal}":
            continue
        if c == f"go to {goal}":
            out += [f"go to {others[0]}", f"open {others[0]}?"]  # the '?' marks an open only if offered
        else:
            out.append(c.replace(f" to {goal}", f" to {others[0]}") if _PUT.match(c) else c)
    return [c if c.endswith("?") else _say(c) for c in out]


def _absent_object(s: Scene) -> list[str] | None:
    i = next((j for j, c in enumerate(s.plan) if _TAKE.match(c)), None)
    if i is None:
        return None
    where = _TAKE.match(s.plan[i]).group(2)
    wrong = f"take {s.absent_kind()} 1 from {where}"
    return [_say(c) for c in s.plan[:i] if not c.startswith("use ")] + [_say(wrong)] * s.rng.randint(1, 3)


def _loop(s: Scene) -> list[str] | None:
    a_b = s.other_places()[:2]
    if len(a_b) < 2:
        a_b = [p for p in s.places if p != _GO.match(s.plan[0]).group(1)][:2]
    seq = s.plan[: s.rng.randint(0, 1)] + [f"go to {a_b[k % 2]}" for k in range(s.max_steps)]
    return [_say(c) for c in seq[: s.max_steps]]


def _give_up(s: Scene) -> list[str] | None:
    return [_say(c) for c in s.plan[: s.rng.randint(1, max(1, len(s.plan) - 2))]]


def _repeat_refused(s: Scene) -> list[str] | None:
    take = next((m for c in s.plan if (m := _TAKE.match(c))), None)
    if take is None:
        return None
    elsewhere = [p for p in s.places if p != take.group(2)]
    cmd = f"take {take.group(1)} from {elsewhere[0]}"
    return [_say(s.plan[0])] + [_say(cmd)] * s.rng.randint(3, s.max_steps - 1)


def _malformed(s: Scene) -> list[str] | None:
    cmd = s.plan[1 % len(s.plan)]
    rest = [_MALFORMED[k % len(_MALFORMED)].format(cmd=cmd) if s.rng.random() < 0.7 else _say("look")
            for k in range(s.max_steps)]  # fmt: skip
    return ([_say(s.plan[0])] + rest)[: s.max_steps]


def _wrong_appliance(s: Scene) -> list[str] | None:
    i = next((j for j, c in enumerate(s.plan) if _XFORM.match(c)), None)
    if i is None:
        return None
    verb, obj, right = _XFORM.match(s.plan[i]).groups()
    candidates = [p for p in s.places if p != right]
    wrong = next((p for p in candidates if _kind(p) in APPLIANCE_OF_TRANSFORM.values()), candidates[0])
    keep = [c for c in s.plan[:i] if c != f"go to {right}"]
    return [_say(c) for c in keep] + [_say(f"go to {wrong}"), _say(f"{verb} {obj} with {wrong}")]


# mistake -> (the failure type it is, its script)
MISTAKES: dict[str, tuple[str, Script]] = {
    "skip_step": ("missing_precondition", _skip_step),
    "wrong_receptacle": ("wrong_receptacle", _wrong_receptacle),
    "absent_object": ("entity_confusion", _absent_object),
    "loop": ("navigation_loop", _loop),
    "give_up": ("premature_give_up", _give_up),
    "repeat_refused": ("repeated_failed_action", _repeat_refused),
    "malformed": ("action_format_error", _malformed),
    "wrong_appliance": ("wrong_object_interaction", _wrong_appliance),
}


class _LocalEnvs:
    """The slice of `EnvPool` the episode loop uses, over one in-process env (no worker processes)."""

    def __init__(self, pool: TaskPool, env):
        self.pool, self.env = pool, env

    def reset(self, task_ids: list[int], expert: bool = False) -> list[Observation]:
        return [self.env.reset(self.pool.tasks[int(t)]) for t in task_ids]

    def step(self, actions: dict[int, str]) -> dict[int, Observation]:
        return {i: self.env.step(a) for i, a in actions.items()}


@dataclass
class _Scripted:
    """Agent giving a fixed list of responses; it stops (gives up) when the list runs out. A response
    ending in '?' is an `open` given only where the room offers it."""

    script: list[str] | None
    mistake: str
    build: Script
    max_steps: int
    pending: dict[int, str] = field(default_factory=dict)

    def keep_playing(self, turn: Turn) -> bool:
        if self.script is None:  # first turn: the room is known now
            places = [c[len("go to ") :] for c in turn.admissible or [] if c.startswith("go to ")]
            where = "/".join(Path(turn.task.id).parts[-3:])  # not the absolute path: runs differ there
            seed = zlib.crc32(f"{where}|{self.mistake}".encode())
            plan = list(turn.task.expert_plan or ())
            scene = Scene(turn.task, plan, places, self.max_steps, random.Random(seed))
            self.script = self.build(scene) or []
        while self.script and self.script[0].endswith("?"):
            cmd = self.script.pop(0)[:-1]
            if cmd in (turn.admissible or []):
                self.script.insert(0, _say(cmd))
                break
        if not self.script:
            return False
        self.pending[turn.slot] = self.script.pop(0)
        return True

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None:
        return [Move(self.pending.pop(t.slot)) for t in turns] if turns else None


def applicable(task: Task, mistake: str) -> bool:
    """Whether `mistake` can be made on `task` without the room (look tasks have no receptacle, ...)."""
    plan = list(task.expert_plan or ())
    if mistake == "wrong_receptacle":
        return any(_PUT.match(c) for c in plan)
    if mistake in ("wrong_appliance",):
        return any(_XFORM.match(c) for c in plan)
    if mistake == "skip_step":
        return task.type == "look_at_obj_in_light" or any(_XFORM.match(c) for c in plan)
    return bool(plan)


def play_faulty(
    family, pool: TaskPool, env, mistakes: Sequence[str] = tuple(MISTAKES), max_steps: int = 30
) -> list[tuple[Trajectory, str, str]]:
    """(trajectory, mistake, expected failure type) for every applicable (game, mistake) pair of `pool`
    (generated games: they carry their plans), played on `env` (an `AlfWorldEnv`) by the episode loop.
    Episodes that the mistake did not stop from winning are left out."""
    envs = _LocalEnvs(pool, env)
    out = []
    for task_id, task in enumerate(pool.tasks):
        for mistake in mistakes:
            label, build = MISTAKES[mistake]
            if not applicable(task, mistake):
                continue
            agent = _Scripted(None, mistake, build, max_steps)
            traj = play(family, envs, [task_id], agent, max_steps=max_steps).trajectories[0]
            if not traj.won and traj.steps:
                out.append((traj, mistake, label))
    return out
