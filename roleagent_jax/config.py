"""Config checks and algorithm presets, applied once at start so a bad value fails before any work."""

from __future__ import annotations

from pathlib import Path

from ml_collections import ConfigDict

from roleagent_jax.envs.base import registered

ALGOS = ("grpo", "gigpo", "roleagent")
CHOICES = {
    "algo": ALGOS,
    "advantage.mode": ("mean_norm", "mean_std_norm"),
    "loss.kl_type": ("low_var_kl", "kl", "none"),
    "loss.agg": ("token-mean", "seq-mean-token-mean"),
    "optim.schedule": ("constant", "cosine"),
    "train.old_logprobs": ("recompute", "sampler"),
    "wia.mode": ("separate", "inline", "off"),
    "wia.backend": ("rapidfuzz", "difflib"),
    "aiw.analyser": ("llm", "heuristic"),
    "aiw.retrieval": ("fuzzy", "embedding", "llm"),
}
# (key, low, high, low_inclusive): numeric ranges.
RANGES = (
    ("iterations", 0, None, True),
    ("rollout.tasks_per_iter", 1, None, True),
    ("rollout.group_size", 1, None, True),
    ("rollout.temperature", 0.0, None, False),
    ("rollout.top_p", 0.0, 1.0, False),
    ("rollout.top_k", 0, None, True),
    ("rollout.max_prompt_tokens", 16, None, True),
    ("rollout.max_response_tokens", 1, None, True),
    ("rollout.max_rows_per_call", 0, None, True),
    ("env.max_steps", 1, None, True),
    ("env.history_k", 0, None, True),
    ("env.num_workers", 1, None, True),
    ("env.step_timeout", 0.0, None, False),
    ("advantage.gamma", 0.0, 1.0, True),
    ("advantage.omega", 0.0, None, True),
    ("advantage.invalid_penalty", 0.0, None, True),
    ("advantage.negative_scale", 0.0, 1.0, True),
    ("advantage.std_floor", 0.0, None, True),
    ("advantage.anchor_similarity", 0.0, 1.0, False),
    ("loss.clip_eps", 0.0, 1.0, False),
    ("loss.dual_clip", 1.0, None, False),
    ("loss.kl_coef", 0.0, None, True),
    ("loss.entropy_coef", 0.0, None, True),
    ("optim.lr", 0.0, None, False),
    ("optim.weight_decay", 0.0, None, True),
    ("optim.grad_clip", 0.0, None, True),
    ("train.mini_batch_rows", 1, None, True),
    ("train.micro_batch_rows", 1, None, True),
    ("train.ppo_epochs", 1, None, True),
    ("wia.horizon", 1, None, True),
    ("wia.lam", 0.0, None, True),
    ("wia.fraction", 0.0, 1.0, True),
    ("wia.max_tokens", 1, None, True),
    ("aiw.top_k", 1, None, True),
    ("aiw.eta", 0.0, None, True),
    ("aiw.decay", 0.0, 1.0, True),
    ("aiw.temperature", 0.0, None, False),
    ("aiw.epsilon", 0.0, 1.0, True),
    ("aiw.cap", 0.0, 1.0, True),
    ("eval.every", 0, None, True),
    ("checkpoint.every", 0, None, True),
    ("checkpoint.keep", 1, None, True),
    ("warmstart.steps", 0, None, True),
    ("warmstart.explore", 0.0, 0.9, True),
)


def _get(config: ConfigDict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def validate(config: ConfigDict) -> ConfigDict:
    """Raise ValueError naming the key, the bad value and what is allowed; return the config."""
    errors = []
    if config.env.name not in registered():
        errors.append(f"--config.env.name={config.env.name!r}: must be one of {', '.join(registered())}")
    for key, allowed in CHOICES.items():
        value = _get(config, key)
        if value not in allowed:
            errors.append(f"--config.{key}={value!r}: must be one of {', '.join(allowed)}")
    for key, low, high, low_inclusive in RANGES:
        value = _get(config, key)
        too_low = value < low if low_inclusive else value <= low
        if too_low or (high is not None and value > high):
            bound = f"{'>=' if low_inclusive else '>'} {low}" + (
                f" and <= {high}" if high is not None else ""
            )
            errors.append(f"--config.{key}={value!r}: must be {bound}")
    mini, micro = config.train.mini_batch_rows, config.train.micro_batch_rows
    if mini % micro:
        errors.append(f"--config.train.mini_batch_rows={mini} must be a multiple of micro_batch_rows={micro}")
    if config.warmstart.own_games and config.warmstart.n_games < 1:
        errors.append(
            "--config.warmstart.own_games=True needs --config.warmstart.n_games >= 1 (games to play)"
        )
    for axis in ("data", "fsdp", "tensor"):
        size = config.mesh[axis]
        if size == 0 or size < -1:
            errors.append(f"--config.mesh.{axis}={size}: must be a positive size or -1 (fill the rest)")
    if config.model.path and not Path(config.model.path).is_dir():
        errors.append(f"--config.model.path={config.model.path!r}: directory not found")
    if config.tokenizer.path and not Path(config.tokenizer.path).is_dir():
        errors.append(f"--config.tokenizer.path={config.tokenizer.path!r}: directory not found")
    if errors:
        raise ValueError("invalid configuration:\n  " + "\n  ".join(errors))
    return config


def apply_algo(config: ConfigDict) -> ConfigDict:
    """GRPO = episode-level advantages only; GiGPO adds step groups; Role-Agent adds WIA and AIW."""
    config = ConfigDict(config.to_dict())
    config.advantage.step_level = config.algo != "grpo"
    if config.algo in ("grpo", "gigpo"):
        config.wia.mode = "off"
        config.aiw.enabled = False
    return config
