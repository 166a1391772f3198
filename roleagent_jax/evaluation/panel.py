"""Evaluation's library: play every task of a split once with a policy (fixed panel: the pool's task
list, each task's randomness seeded by (seed, task id, step)) and summarise it, success per task type and
the family's score and behaviour rates. The command line (`evaluation.cli`) and the trainer call it."""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from roleagent_jax.envs.base import Family, TaskPool
from roleagent_jax.envs.episodes import Move, Turn, counted, failed_games, lost_share, play, success_summary
from roleagent_jax.envs.pool import EnvPool
from roleagent_jax.types import Trajectory

Policy = Callable[[list[Turn]], list[str]]


class ExpertPolicy:
    """The family's expert: the first action of the plan the env computes for the current state."""

    needs_expert_plan = True

    def __init__(self, family: Family):
        self.family = family

    def __call__(self, batch: list[Turn]) -> list[str]:
        f = self.family
        return [f.format_action((x.observation.expert_plan or [f.empty_action])[0]) for x in batch]


class RandomPolicy:
    """The family's random response (a uniformly random admissible action, or random text for free-form
    families), seeded per (seed, task, step) for a reproducible panel."""

    needs_expert_plan = False

    def __init__(self, family: Family, seed: int = 0):
        self.family, self.seed = family, seed

    def __call__(self, batch: list[Turn]) -> list[str]:
        out = []
        for x in batch:
            rng = random.Random(f"{self.seed}:{x.task_id}:{x.step}")
            out.append(self.family.random_response(rng, x.goal, x.observation))
        return out


class PolicyAgent:
    """A policy as the episode loop's agent: one policy call per step, nothing after the last."""

    def __init__(self, policy: Policy):
        self.policy = policy

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None:
        if not turns:
            return None
        responses = self.policy(turns)
        if len(responses) != len(turns):
            raise ValueError(f"policy returned {len(responses)} responses for {len(turns)} inputs")
        return [Move(text) for text in responses]


def run_episodes(
    policy: Policy, family: Family, envs: EnvPool, task_ids: list[int], max_steps: int
) -> list[Trajectory]:
    """One episode per task id, all in lockstep on the pool's slots (the policy's prompt settings)."""
    return play(
        family,
        envs,
        task_ids,
        PolicyAgent(policy),
        max_steps=max_steps,
        history_k=int(getattr(policy, "history_k", 0)),
        expert=bool(getattr(policy, "needs_expert_plan", False)),
    ).trajectories


def summarize(
    split: str,
    trajs: Sequence[Trajectory],
    task_types: Sequence[str],
    score_name: str = "score",
    pool: TaskPool | None = None,
    family: Family | None = None,
) -> dict:
    """Success overall and per task type (in the family's order), plus a few diagnostics: the one
    summary of an evaluation, for this command, the trainer's evaluations and the report. Families that
    score episodes (`Observation.score`) also get `score_name` and the mean score under that name, its
    standard error (`<score_name>_se`) and the mean per type (`per_type_<score_name>`); an episode that
    ended without a score counts 0. Episodes lost to their environment (a crashed or hung worker, a
    retriever that failed) are in no rate: `n` counts the others, `lost` and `lost_share` the lost ones,
    and with the pool `failed_games` names them with the reason. `wins` lists each game's outcome in
    task-id order (None for a lost one), so two evaluations of the same games pair up (the paired
    difference's standard error, a fixed subset's rate). With the family and the pool, `behaviour` holds
    the family's rates of what the episodes did (`Family.behaviour`), where it reports any, and
    `warnings` what it finds wrong with the environment (`Family.warnings`)."""
    played = trajs
    trajs = counted(played)
    per_type = success_summary(trajs, task_types)
    del per_type["all"]
    n = len(trajs)
    steps = sum(len(t.steps) for t in trajs)
    invalid = sum(not s.valid for t in trajs for s in t.steps)
    out = {
        "split": split,
        "n": n,
        "success": sum(t.won for t in trajs) / max(n, 1),
        "per_type": per_type,
        "count_per_type": {k: sum(t.task_type == k for t in trajs) for k in per_type},
        "lost": len(played) - n,
        "lost_share": lost_share(played),
        "failed_games": failed_games(played, pool) if pool is not None else [],
        "invalid_rate": invalid / max(steps, 1),
        "mean_steps": steps / max(n, 1),
        "wins": [None if t.env_failed else int(t.won) for t in sorted(played, key=lambda t: t.task_id)],
    }
    if any(t.score is not None for t in trajs):
        scores = {k: [t.score or 0.0 for t in trajs if t.task_type == k] for k in per_type}
        every = [t.score or 0.0 for t in trajs]
        out["score_name"] = score_name
        out[score_name] = sum(every) / n
        out[f"{score_name}_se"] = statistics.stdev(every) / math.sqrt(n) if n > 1 else 0.0
        out[f"per_type_{score_name}"] = {k: sum(v) / len(v) for k, v in scores.items()}
    behaviour = family.behaviour(trajs, pool) if family is not None and pool is not None else {}
    if behaviour:
        out["behaviour"] = dict(behaviour)
    warnings = family.warnings(played) if family is not None else []
    if warnings:
        out["warnings"] = list(warnings)
    return out


def behaviour_value(value: float) -> str:
    """One `behaviour` number as the tables print it: a count (an int) as it is, a rate to three decimals."""
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def behaviour_text(behaviour: Mapping[str, float]) -> str:
    """A `behaviour` dict in one line of `name value` pairs."""
    return ", ".join(f"{k} {behaviour_value(v)}" for k, v in behaviour.items())


def evaluate(policy: Policy, family: Family, task_pool: TaskPool, split: str = "", **settings: Any) -> dict:
    """`summarize` of `evaluate_trajectories` (whose keyword settings it takes): every task of the pool
    once, or the first `limit`."""
    trajs = evaluate_trajectories(policy, family, task_pool, **settings)
    return summarize(split, trajs, family.task_types, family.score_name, task_pool, family)


def evaluate_trajectories(
    policy: Policy,
    family: Family,
    task_pool: TaskPool,
    *,
    num_workers: int = 2,
    max_steps: int = 50,
    batch_size: int = 32,
    step_timeout: float = 60.0,
    limit: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[Trajectory]:
    """Every task of the pool once (the first `limit` when limit > 0), batch_size episodes at a time: the
    episodes behind `evaluate`, for callers that measure more than its summary (batch_size 0: all at once)."""
    ids = list(range(len(task_pool)))[: limit or None]
    batch_size = batch_size or len(ids)  # 0: every game at once, as the trainer's evaluation plays them
    trajs: list[Trajectory] = []
    start = time.perf_counter()
    with EnvPool(
        family, task_pool, num_workers=num_workers, step_timeout=step_timeout, max_steps=max_steps
    ) as envs:
        for b in range(0, len(ids), batch_size):
            trajs += run_episodes(policy, family, envs, ids[b : b + batch_size], max_steps)
            if log:
                won = sum(t.won for t in trajs)
                log(f"[{len(trajs)}/{len(ids)}] won {won} ({time.perf_counter() - start:.0f}s)")
    return trajs


def episode_record(traj: Trajectory) -> dict:
    """One episode as plain JSON: what was asked, what the policy wrote and what came back at each step."""
    return {
        "task_id": traj.task_id,
        "task_type": traj.task_type,
        "goal": traj.goal,
        "won": traj.won,
        "score": traj.score,
        "env_failed": traj.env_failed,
        "steps": [
            {
                "response": s.response,
                "action": s.action,
                "valid": s.valid,
                "reward": s.reward,
                "result": s.next_observation,
            }
            for s in traj.steps
        ],
    }


def write_episodes(path: str | Path, trajs: Sequence[Trajectory]) -> None:
    """Every episode in task-id order, one JSON object a line; written whole or not at all (temp + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for t in sorted(trajs, key=lambda t: t.task_id):
            f.write(json.dumps(episode_record(t)) + "\n")
    tmp.replace(path)


def make_policy(
    name: str, seed: int, checkpoint: str | None, temperature: float, family: Family, greedy: bool = False
) -> Policy:
    if checkpoint:
        from roleagent_jax.evaluation.policy import ModelPolicy  # JAX and the model load only when needed

        return ModelPolicy(checkpoint, family, temperature, seed=seed, greedy=greedy)
    if name == "expert":
        if not family.has_expert:
            raise ValueError(
                f"environment {family.name!r} has no expert: use --policy=random or --checkpoint"
            )
        return ExpertPolicy(family)
    if name == "random":
        return RandomPolicy(family, seed)
    raise ValueError(f"unknown policy {name!r}: use expert, random, or --checkpoint=DIR")
