"""Config checks and algorithm presets, applied once at start so a bad value fails before any work."""

from __future__ import annotations

from pathlib import Path

from ml_collections import ConfigDict

from roleagent_jax.envs.base import Family, get_family, registered

ALGOS = ("grpo", "gigpo", "wia", "aiw", "roleagent")
CHOICES = {
    "algo": ALGOS,
    "model.param_dtype": ("float32", "bfloat16", "float16"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "advantage.mode": ("mean_norm", "mean_std_norm"),
    "loss.kl_type": ("low_var_kl", "kl", "none"),
    "loss.agg": ("token-mean", "seq-mean-token-mean"),
    "optim.schedule": ("constant", "cosine"),
    "train.old_logprobs": ("recompute", "sampler"),
    "wia.mode": ("separate", "inline", "off"),
    "wia.backend": ("rapidfuzz", "difflib"),
    "aiw.analyser": ("llm", "heuristic"),
    "aiw.retrieval": ("fuzzy", "llm"),
    "aiw.aggregate": ("max", "sum"),
    "env.on_corrupt": ("fail", "skip"),
}
# (key, low, high, low_inclusive): numeric ranges.
RANGES = (
    ("seed", 0, None, True),
    ("iterations", 0, None, True),
    ("tokenizer.train_vocab_size", 300, None, True),
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
    ("env.gen.n_train", 1, None, True),
    ("env.gen.n_eval", 1, None, True),
    ("env.gen.seed", 0, None, True),
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
    ("optim.warmup_steps", 0, None, True),
    ("train.mini_batch_rows", 1, None, True),
    ("train.micro_batch_rows", 1, None, True),
    ("train.ppo_epochs", 1, None, True),
    ("wia.horizon", 1, None, True),
    ("wia.lam", 0.0, None, True),
    ("wia.fraction", 0.0, 1.0, True),
    ("wia.max_tokens", 1, None, True),
    ("aiw.top_k", 1, None, True),
    ("aiw.min_sim", 0.0, 1.0, True),
    ("aiw.self_boost", 0.0, None, True),
    ("aiw.eta", 0.0, None, True),
    ("aiw.decay", 0.0, 1.0, True),
    ("aiw.temperature", 0.0, None, False),
    ("aiw.epsilon", 0.0, 1.0, True),
    ("aiw.cap", 0.0, 1.0, True),
    ("aiw.unlearnable_weight", 0.0, 1.0, True),
    ("aiw.max_tokens", 1, None, True),
    ("eval.every", 0, None, True),
    ("eval.temperature", 0.0, None, True),
    ("eval.limit", 0, None, True),
    ("checkpoint.every", 0, None, True),
    ("checkpoint.keep", 1, None, True),
    ("warmstart.steps", 0, None, True),
    ("warmstart.copy_steps", 0, None, True),
    ("warmstart.lr", 0.0, None, False),
    ("warmstart.batch_rows", 1, None, True),
    ("warmstart.checkpoint_every", 0, None, True),
    ("warmstart.n_games", 0, None, True),
    ("warmstart.explore", 0.0, 0.9, True),
    ("warmstart.predictor_fraction", 0.0, 1.0, True),
)
# Paths a user may write as ~/...: the shell does not expand ~ after --flag=.
PATH_KEYS = ("workdir", "model.path", "tokenizer.path", "env.data_dir", "env.gen.dir")


def _get(config: ConfigDict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def family_options(config: ConfigDict, family: Family) -> dict:
    """The family's own settings: the config's `env.<family name>` subtree when it has one."""
    node = config.env.get(family.name)
    return dict(node.to_dict()) if node is not None else {}


def expand_paths(config: ConfigDict) -> ConfigDict:
    """A copy of the config with ``~`` expanded in every path key."""
    config = ConfigDict(config.to_dict())
    for key in PATH_KEYS:
        parent, _, name = key.rpartition(".")
        node = _get(config, parent) if parent else config
        if node[name]:
            node[name] = str(Path(node[name]).expanduser())
    return config


def _split_errors(config: ConfigDict, family) -> list[str]:
    """Split names the family does not know, named with the ones it does (before the warm start)."""
    known = family.known_splits()
    if known is None:
        return []
    errors = []
    hint = f"{family.name} knows {', '.join(known)}"
    if config.env.train_split not in known:
        errors.append(f"--config.env.train_split={config.env.train_split!r}: {hint}")
    splits = config.env.eval_splits
    for split in (splits,) if isinstance(splits, str) else splits:
        if split not in known:
            errors.append(f"--config.env.eval_splits: unknown split {split!r}; {hint}")
    return errors


def startup_errors(config: ConfigDict) -> list[str]:
    """Checks across keys, of the model's shape and of the model directory's files (headers only), so
    a run fails before any game is played."""
    errors = []
    if config.env.name not in registered():
        errors.append(f"--config.env.name={config.env.name!r}: must be one of {', '.join(registered())}")
    else:
        family = get_family(config.env.name)
        try:
            family.check_options(family.resolve_options(family_options(config, family)))
        except (ValueError, TypeError) as err:
            errors.append(f"--config.env.{family.name}: {err}")
        errors += _split_errors(config, family)
    if config.checkpoint.overwrite and config.checkpoint.resume:
        errors.append(
            "--config.checkpoint.overwrite=True moves an earlier run aside and starts afresh: it needs "
            "--config.checkpoint.resume=False"
        )
    if config.model.required and not config.model.path:
        errors.append(
            "--config.model.path is empty: this config trains a pretrained model; set it to a Hugging Face "
            "Qwen2 directory (or $ROLEAGENT_MODEL)"
        )
    if config.env.data_required and config.env.name in registered():
        errors += _data_errors(config)
    if config.model.path and Path(config.model.path).is_dir():
        from roleagent_jax.models.hf_io import check_pretrained

        try:
            check_pretrained(config.model.path)
        except (ValueError, FileNotFoundError) as err:
            errors.append(f"--config.model.path={config.model.path!r}: {err}")
    tokenizer_key = "tokenizer.path" if config.tokenizer.path else "model.path"
    tokenizer_dir = config.tokenizer.path or config.model.path
    if tokenizer_dir and Path(tokenizer_dir).is_dir():
        from roleagent_jax.tokenizer import check_tokenizer_dir

        try:
            check_tokenizer_dir(tokenizer_dir)
        except (ValueError, FileNotFoundError) as err:
            errors.append(f"--config.{tokenizer_key}={tokenizer_dir!r}: {err}")
    from roleagent_jax.models.lora import LoRAConfig

    try:
        LoRAConfig(**config.lora.to_dict())
    except (ValueError, TypeError) as err:
        errors.append(f"--config.{err}")
    if not config.model.path:
        from roleagent_jax.models import Qwen2Config

        init = dict(config.model.init.to_dict(), vocab_size=1, model_type="qwen2")
        try:
            Qwen2Config.from_hf(init, param_dtype=config.model.param_dtype, dtype=config.model.dtype)
        except (ValueError, TypeError) as err:
            errors.append(f"--config.model.init: {err}")
    return errors


def _data_errors(config: ConfigDict) -> list[str]:
    """The real (not generated) splits the run reads, each looked up without loading a game."""
    family = get_family(config.env.name)
    splits = [config.env.train_split, *config.env.eval_splits]
    for split in dict.fromkeys(s for s in splits if s not in family.generated_splits):
        try:
            family.check_data(split, config.env.data_dir or None)
        except FileNotFoundError as err:
            return [f"--config.env.data_dir={config.env.data_dir!r}: {' '.join(str(err).split())}"]
    return []


def validate(config: ConfigDict) -> ConfigDict:
    """Raise ValueError naming the key, the bad value and what is allowed; return the config (with
    ``~`` expanded in its paths)."""
    config = expand_paths(config)
    errors = startup_errors(config)
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
    """GRPO = episode-level advantages only; GiGPO adds step groups; Role-Agent adds WIA and AIW. The
    paper's ablations: ``wia`` = GiGPO + WIA, ``aiw`` = GiGPO + AIW."""
    config = ConfigDict(config.to_dict())
    config.advantage.step_level = config.algo != "grpo"
    if config.algo in ("grpo", "gigpo", "aiw"):
        config.wia.mode = "off"
    if config.algo in ("grpo", "gigpo", "wia"):
        config.aiw.enabled = False
    return config
