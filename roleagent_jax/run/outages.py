"""Episodes lost to their environment (a retriever that failed, a crashed or hung worker) are not the
agent's losses: they are kept out of every rate and every PPO row, and past `env.max_lost_share` the run
stops (exit 3) before anything of that iteration or evaluation is kept, instead of teaching the policy
that searching fails."""

from __future__ import annotations

from collections.abc import Sequence

from ml_collections import ConfigDict

from roleagent_jax.config.exit_codes import EnvironmentOutage
from roleagent_jax.envs import Family, TaskPool
from roleagent_jax.envs.episodes import lost_share
from roleagent_jax.run.setup import print_failed
from roleagent_jax.types import Trajectory


def check_environment(
    what: str, trajs: Sequence[Trajectory], pool: TaskPool, family: Family, config: ConfigDict
) -> None:
    """Raise `EnvironmentOutage` when more than the run's `env.max_lost_share` of the episodes were lost;
    else name the lost games and print what the family finds wrong with the environment
    (`Family.warnings`)."""
    share, max_lost_share = lost_share(trajs), config.env.max_lost_share
    if share > max_lost_share:
        reasons = sorted({t.env_error or "environment failed" for t in trajs if t.env_failed})
        raise EnvironmentOutage(
            f"{what} lost {sum(t.env_failed for t in trajs)} of {len(trajs)} episodes to the environment "
            f"({'; '.join(reasons)[:300]}), more than --config.env.max_lost_share={max_lost_share}"
        )
    print_failed(what, trajs, pool)
    for line in family.warnings(trajs):
        print(f"warning: {what}: {line}", flush=True)
