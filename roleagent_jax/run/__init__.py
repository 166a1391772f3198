"""A training run: its setup, the iteration (rollout, warm start, update, AIW), checkpoints, the run
record, metrics and the end-of-run report."""
