"""ALFWorld environments: the real engine, generated games, a parallel pool, prompts and parsing.

Nothing here imports JAX: environment worker processes import this package.
"""

from roleagent_jax.envs.alfworld import TASK_TYPES, WIN_REWARD, AlfWorldEnv
from roleagent_jax.envs.alfworld_tasks import GEN_SPLITS, TaskPool
from roleagent_jax.envs.pool import EnvPool
from roleagent_jax.envs.prompts import ACTION_STOP, build_agent_prompt, parse_action

__all__ = [
    "ACTION_STOP",
    "GEN_SPLITS",
    "TASK_TYPES",
    "WIN_REWARD",
    "AlfWorldEnv",
    "EnvPool",
    "TaskPool",
    "build_agent_prompt",
    "parse_action",
]
