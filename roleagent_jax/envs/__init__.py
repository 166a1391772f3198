"""Scenario families behind one contract (`base`), played in parallel worker processes (`pool`).

Nothing here imports JAX or an engine: environment worker processes import this package, and a
family's engine loads only when its env is built. Each family lives in `envs/<family>/`.
"""

from roleagent_jax.envs.base import (
    Admissible,
    Env,
    Family,
    History,
    Observation,
    PoolRequest,
    Task,
    TaskPool,
)
from roleagent_jax.envs.pool import EnvPool
from roleagent_jax.envs.predictor_prompt import PredictorFraming
from roleagent_jax.envs.registry import get_family, register, registered, unregister

__all__ = [
    "Admissible",
    "Env",
    "EnvPool",
    "Family",
    "History",
    "Observation",
    "PoolRequest",
    "PredictorFraming",
    "Task",
    "TaskPool",
    "get_family",
    "register",
    "registered",
    "unregister",
]
