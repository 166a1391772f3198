"""The "key note" family: a task that needs both the observation and more than one step.

The agent starts in a hall where a note names the room that holds the key. It must go to that room
(step 1, which only the note can tell) and take the key (step 2). Leaving a room for the hall is always
allowed, so with more than two steps a wrong room is a detour that can still win later; the hall is the
same state (same text, same anchor) every time, which is what GiGPO's step groups compare.

Kept free of JAX at its top level: env worker processes import this module to unpickle the family.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from roleagent_jax.envs import Admissible, Family, History, Observation, PoolRequest, Task, TaskPool
from roleagent_jax.envs.text import action_block

ROOMS = ("kitchen", "garden", "attic")
HALL = "hall"


class KeyNoteEnv:
    """One episode of one task: the key lies in `task.payload`, one of ROOMS."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps

    def reset(self, task: Task, expert: bool = False) -> Observation:
        self.key, self.room, self.steps, self.expert = task.payload, HALL, 0, expert
        return self._observe(0.0, won=False, note="")

    def step(self, action: str) -> Observation:
        if self.last.done:
            return dataclasses.replace(self.last, reward=0.0)
        self.steps += 1
        note = ""
        if self.room == HALL and action.startswith("go to ") and action[6:] in ROOMS:
            self.room = action[6:]
        elif self.room != HALL and action == "go to hall":
            self.room = HALL
        elif action == "take key" and self.room != self.key:
            note = " There is no key here."
        won = action == "take key" and self.room == self.key
        return self._observe(1.0 if won else 0.0, won, note)

    def _observe(self, reward: float, won: bool, note: str) -> Observation:
        if won:
            text, moves = "You take the key.", []
        elif self.room == HALL:
            k = self.key  # named three times: one word in a long prompt is hard for a model from scratch
            text = f"You are in the hall. A note says the key is in the {k}. Footprints lead to the {k}. You hear a jingle from the {k}."
            moves = [f"go to {r}" for r in ROOMS]
        else:
            seen = "A key lies here." if self.room == self.key else "The room is empty."
            text, moves = f"You are in the {self.room}. {seen}{note}", ["take key", "go to hall"]
        plan = None
        if self.expert and not won:
            plan = ["take key"] if self.room == self.key else ([] if self.room == HALL else ["go to hall"])
            plan += [f"go to {self.key}", "take key"] if self.room != self.key else []
        done = won or self.steps >= self.max_steps
        self.last = Observation(text, text, moves, reward, done, won, expert_plan=plan)
        return self.last


class KeyNote(Family):
    """Registered as "keynote"; task type = the key's room, so success is reported per room."""

    name = "keynote"
    task_types = ROOMS
    empty_action = "look"
    has_expert = True
    data_splits = ()
    generated_splits = ("gen",)
    failure_types = {"wrong_room": "went to a room the note did not name"}

    def make_env(self, max_steps: int) -> KeyNoteEnv:
        return KeyNoteEnv(max_steps)

    def generated_tasks(self, request: PoolRequest) -> TaskPool:
        rng = random.Random(f"keynote:{request.seed}")
        keys = [ROOMS[i % len(ROOMS)] for i in range(request.n)]  # balanced: no room is a better guess
        rng.shuffle(keys)
        tasks = [
            Task(f"key{i}", k, "take the key.", k, (f"go to {k}", "take key")) for i, k in enumerate(keys)
        ]
        return TaskPool(tasks, source=f"keynote seed {request.seed}")

    def agent_prompt(
        self, goal: str, history: History, observation: str, admissible: Admissible, step: int, history_k: int
    ) -> str:
        seen = "".join(f"Saw: {o} Did: {a}\n" for o, a in (history[-history_k:] if history_k else []))
        # The goal and the commands never change: a model trained from scratch reads a short prompt best,
        # where the one word that differs between tasks is not drowned by constant text.
        return f"{seen}{observation}"

    def parse_action(self, response: str, admissible: Sequence[str] | None) -> tuple[str | None, bool]:
        action = action_block(response)
        if action is None:
            return None, False
        return action, admissible is None or action in admissible
