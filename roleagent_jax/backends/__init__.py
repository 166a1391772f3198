"""Rollout backends: what turns prompts into text for every role of the policy. `base` holds the
interface and the registry (`BACKENDS`, chosen by the `rollout.backend` key); each backend is a module
beside it (`jax`: the in-process jitted sampler). Importing this package loads no backend."""

from roleagent_jax.backends.base import BACKENDS, RolloutBackend, make_backend

__all__ = ["BACKENDS", "RolloutBackend", "make_backend"]
