"""The memory planner: per-device bytes of a run's params, optimizer state, KV cache and activations on
a mesh, and the advice of `python -m roleagent_jax.plan`."""
