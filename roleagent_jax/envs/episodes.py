"""The one episode loop: every environment slot steps in lockstep, one agent decision per step.

Training rollouts, evaluation and the warm start's expert play all run `play`. What differs between
them is the `Agent`: it turns the batch of turns of a step into responses (a sampler call, a scripted
policy, the expert's plan), may extend its own call with more requests (WIA's predictor prompts ride
on the agent's sampler call), hears about each recorded step (`after_step`), and may end an episode
early (`keep_playing`). The loop owns the bookkeeping: resets, the agent prompt, parsing, what the env
receives, trajectories and the success summary.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from roleagent_jax.envs.base import Family, Observation, Task, TaskPool
from roleagent_jax.types import Step, Trajectory


@dataclass
class Turn:
    """What an agent sees for one slot at one step."""

    slot: int
    task_id: int  # index into the task pool
    task: Task
    observation: Observation
    history: list[tuple[str, str]]  # earlier (observation text, action sent) pairs, oldest first
    step: int  # 0-based
    family: Family = field(repr=False)
    history_k: int = 0

    @property
    def goal(self) -> str:
        return self.task.goal

    @property
    def admissible(self) -> list[str] | None:
        return self.observation.admissible

    @cached_property
    def prompt(self) -> str:
        """The family's agent prompt for this turn (built on first use)."""
        o = self.observation
        return self.family.agent_prompt(
            self.goal, self.history, o.text, o.admissible, self.step, self.history_k
        )


@dataclass
class Move:
    """An agent's answer for one turn. `response` is parsed with the family's parser unless `action` is
    given: then that action is played as is and recorded as valid (the expert's exploration moves)."""

    response: str
    action: str | None = None


class Agent(Protocol):
    """Decides every active slot's move at each step (see the module docstring).

    `act(step, turns)` returns one Move per turn, in order; or None to stop the loop. It is called once
    more with no turns after the last step, and again while it returns a list (a sampler call that still
    carries other requests, e.g. predictor prompts or other processes' rows); return None when there is
    nothing left to do. Optional hooks: `after_step(turn, traj, step, sent)` after each recorded step
    (`sent` is what the env received) and `keep_playing(turn) -> bool` before a slot's next turn.
    """

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None: ...


@dataclass
class Played:
    """The loop's result: one trajectory per slot, and where its time went."""

    trajectories: list[Trajectory]
    time_env: float = 0.0


def play(
    family: Family,
    envs,
    task_ids: Sequence[int],
    agent: Agent,
    *,
    max_steps: int,
    history_k: int = 0,
    group_ids: Sequence[int] | None = None,
    slot_offset: int = 0,
    expert: bool | None = None,
) -> Played:
    """One episode per slot (slot i plays task pool[task_ids[i]] of `envs`, an EnvPool), all in lockstep.

    A step's env `done`, a failed env, or the `max_steps`-th step ends an episode. An unparsable
    response still reaches the env as `family.unparsed_action(response)` and is recorded as invalid.
    Trajectory ids are `slot_offset + i` (unique across processes that split one batch). `expert`:
    whether observations carry the expert's plan (None: the pool's default).
    """
    n = len(task_ids)
    group_ids = list(group_ids) if group_ids is not None else [-1] * n
    after_step = getattr(agent, "after_step", None)
    keep_playing = getattr(agent, "keep_playing", None)
    start = time.perf_counter()
    resets = envs.reset(list(task_ids)) if expert is None else envs.reset(list(task_ids), expert=expert)
    time_env = time.perf_counter() - start
    tasks = [envs.pool.tasks[int(t)] for t in task_ids]
    trajs = [
        Trajectory(
            task_id=int(task_ids[i]),
            task_type=tasks[i].type,
            goal=tasks[i].goal,
            group_id=int(group_ids[i]),
            traj_id=slot_offset + i,
            env_failed=obs.failed,
            env_error=str(obs.info.get("error", "")) if obs.failed else "",
        )
        for i, obs in enumerate(resets)
    ]
    history: list[list[tuple[str, str]]] = [[] for _ in range(n)]

    def turn(i: int, obs: Observation, t: int) -> Turn:
        return Turn(i, int(task_ids[i]), tasks[i], obs, history[i], t, family, history_k)

    turns = {i: turn(i, obs, 0) for i, obs in enumerate(resets) if not obs.failed}
    active = [i for i in turns if keep_playing is None or keep_playing(turns[i])]
    for t in range(max_steps + 1):
        batch = [turns[i] for i in active] if t < max_steps else []
        moves = agent.act(t, batch)
        if moves is None:
            break
        if not batch:
            continue
        if len(moves) != len(batch):
            raise ValueError(f"agent returned {len(moves)} moves for {len(batch)} turns")
        chosen: dict[int, tuple[str | None, bool, str]] = {}
        for tr, move in zip(batch, moves):
            if move.action is not None:
                chosen[tr.slot] = (move.action, True, move.action)
            else:
                action, valid = family.parse_action(move.response, tr.admissible)
                sent = action if action is not None else family.unparsed_action(move.response)
                chosen[tr.slot] = (action, valid, sent)
        start = time.perf_counter()
        outcomes = envs.step({i: chosen[i][2] for i in active})
        time_env += time.perf_counter() - start
        still = []
        for tr, move in zip(batch, moves):
            i = tr.slot
            action, valid, sent = chosen[i]
            out = outcomes[i]
            done = out.done or out.failed or t + 1 >= max_steps
            step = Step(
                observation=tr.observation.text,
                admissible=None if tr.admissible is None else list(tr.admissible),
                response=move.response,
                action=action,
                valid=valid,
                reward=float(out.reward),
                next_observation=out.text,
                done=done,
                parsed=action is not None,
            )
            trajs[i].steps.append(step)
            if after_step is not None:
                after_step(tr, trajs[i], step, sent)
            history[i].append((tr.observation.text, sent))
            if out.failed and not trajs[i].env_failed:
                trajs[i].env_error = str(out.info.get("error", ""))
            trajs[i].env_failed = trajs[i].env_failed or out.failed
            trajs[i].won = trajs[i].won or out.won
            if out.score is not None:
                trajs[i].score = out.score
            if not done:
                turns[i] = turn(i, out, t + 1)
                if keep_playing is None or keep_playing(turns[i]):
                    still.append(i)
        active = still
    return Played(trajs, time_env)


def counted(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The episodes the agent played to an outcome: those lost to their environment (a crashed or hung
    worker, a retriever that failed) are no loss of the agent's and count in no rate."""
    return [t for t in trajs if not t.env_failed]


def lost_share(trajs: Sequence[Trajectory]) -> float:
    return sum(t.env_failed for t in trajs) / len(trajs) if trajs else 0.0


def success_summary(trajs: Sequence[Trajectory], task_types: Sequence[str]) -> dict[str, float]:
    """Success per task type (the family's canonical order; types it does not list follow, sorted), then
    "all", over the episodes not lost to their environment (`counted`)."""
    trajs = counted(trajs)
    by_type: dict[str, list[float]] = defaultdict(list)
    for tr in trajs:
        by_type[tr.task_type].append(float(tr.won))
    order = [t for t in task_types if t in by_type] + sorted(set(by_type) - set(task_types))
    out = {t: sum(by_type[t]) / len(by_type[t]) for t in order}
    out["all"] = sum(tr.won for tr in trajs) / len(trajs) if trajs else 0.0
    return out


def failed_games(trajs: Sequence[Trajectory], pool: TaskPool) -> list[dict[str, str]]:
    """The episodes whose environment failed, by task name and reason (kept out of every rate, and
    listed so a reader sees which games an outage took)."""
    return [
        {"task": str(pool[t.task_id].id), "reason": t.env_error or "environment failed"}
        for t in trajs
        if t.env_failed
    ]
