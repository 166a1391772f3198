"""The run's evaluation: every game of a split once (fixed panel) with the current policy, without WIA's
predictions or branching, summarised as the command line summarises (`evaluation.panel.summarize`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ml_collections import ConfigDict

from roleagent_jax.envs import Family, TaskPool
from roleagent_jax.evaluation.panel import summarize
from roleagent_jax.run.outages import check_environment
from roleagent_jax.run.rollout import collect_all
from roleagent_jax.run.setup import env_pool, say
from roleagent_jax.types import RolloutSettings


def evaluate_split(
    config: ConfigDict,
    family: Family,
    pool: TaskPool,
    split: str,
    generate: Callable,
    tokenizer,
    settings: RolloutSettings,
    limit: int = 0,
) -> dict:
    """The summary of `split`'s first `limit` games (0: all) played with `generate`; an outage past
    `env.max_lost_share` stops the run (`outages.check_environment`)."""
    c = config
    ids = list(range(len(pool)))[: limit or None]
    say(c, f"evaluation: playing {len(ids)} {split} games")
    plain = dataclasses.replace(
        settings, wia_mode="off", branch_at=0, branch_openers=False, expert_branch=False
    )
    with env_pool(c, family, pool) as envs:
        result = collect_all(generate, family, envs, ids, ids, tokenizer, plain, c.seed)
    check_environment(f"evaluation on {split}", result.trajectories, pool, family, c)
    return summarize(split, result.trajectories, family.task_types, family.score_name, pool, family)
