"""Config checks and algorithm presets, applied once at start so a bad value fails before any work:
each key's own check (declared with it in `keys.py`), then checks across keys and of the files named."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ml_collections import ConfigDict

from roleagent_jax.config.keys import ALGO_PRESETS, CONFIG, RENAMED
from roleagent_jax.config.schema import FamilyOptions, lookup
from roleagent_jax.envs.registry import get_family, registered

# Paths a user may write as ~/...: the shell does not expand ~ after --flag=.
PATH_KEYS = ("workdir", "model.path", "tokenizer.path", "env.data_dir", "env.gen.dir")


def expand_paths(config: ConfigDict) -> ConfigDict:
    """A copy of the config with ``~`` expanded in every path key."""
    config = ConfigDict(config.to_dict())
    for key in PATH_KEYS:
        parent, _, name = key.rpartition(".")
        node = lookup(config, parent) if parent else config
        if node[name]:
            node[name] = str(Path(node[name]).expanduser())
    return config


def _split_errors(config: ConfigDict, family) -> list[str]:
    """Split names the family does not know, named with the ones it does (before the warm start)."""
    known = family.known_splits()
    if known is None:
        return _open_split_errors(config, family)
    errors = []
    hint = f"{family.name} knows {', '.join(known)}"
    if config.env.train_split not in known:
        errors.append(f"--config.env.train_split={config.env.train_split!r}: {hint}")
    splits = config.env.eval_splits
    for split in (splits,) if isinstance(splits, str) else splits:
        if split not in known:
            errors.append(f"--config.env.eval_splits: unknown split {split!r}; {hint}")
    return errors


def _open_split_errors(config: ConfigDict, family) -> list[str]:
    """Split names a family without a closed list refuses (search QA: a data set it does not know)."""
    splits = config.env.eval_splits
    named = [("train_split", config.env.train_split)]
    named += [("eval_splits", s) for s in ((splits,) if isinstance(splits, str) else splits)]
    for key, split in named:
        try:
            family.check_split(split)
        except ValueError as err:
            return [f"--config.env.{key}: {err}"]
    return []


def startup_errors(config: ConfigDict) -> list[str]:
    """Checks across keys, of the model's shape, of the device mesh and of the model directory's files
    (headers only), so a run fails before its workdir is made and before any game is played."""
    errors = []
    if config.env.name not in registered():
        errors.append(f"--config.env.name={config.env.name!r}: must be one of {', '.join(registered())}")
    else:
        family = get_family(config.env.name)
        errors += FamilyOptions.errors(config, family)
        errors += _split_errors(config, family)
        errors += _warmstart_errors(config, family)
        errors += _branch_errors(config, family)
        errors += pool_size_errors(config, family)
        if config.env.data_required:
            errors += _data_errors(config)
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
    if config.wia.fraction == 0 and config.wia.mode != "off" and config.algo in ("wia", "roleagent"):
        errors.append(
            f"--config.wia.fraction=0.0: WIA predicts no step, so algo={config.algo} would run without it; "
            "set a share > 0, or --config.algo=gigpo (aiw) for the run without WIA"
        )
    errors += _workdir_errors(config.workdir)
    errors += _mesh_errors(config)
    errors += _model_errors(config)
    return errors


def _workdir_errors(workdir: str) -> list[str]:
    """A workdir that cannot be a folder (it, or a folder above it, is a file) or cannot be made there
    (the nearest existing folder above it is not writable)."""
    path = Path(workdir).absolute()
    flag = f"--config.workdir={workdir!r}"
    if path.exists() and not path.is_dir():
        return [f"{flag}: {path} is a file, not a folder"]
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return [f"{flag}: {existing} is a file, so no folder can be made under it"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"{flag}: {existing} is not writable"]
    return []


def pool_size_errors(config: ConfigDict, family, train_pool_size: int | None = None) -> list[str]:
    """An iteration draws `rollout.tasks_per_iter` distinct tasks of the training pool: more than the pool
    holds fails at the first draw, after the games and the warm start. A generated pool's size is known
    from the config; a real split's (`train_pool_size`) once its file is read, before any game is played."""
    if train_pool_size is None and config.env.train_split in family.generated_splits:
        train_pool_size, source = config.env.gen.n_train, "--config.env.gen.n_train"
    else:
        source = f"env.train_split={config.env.train_split!r}"
    if train_pool_size is None or config.rollout.tasks_per_iter <= train_pool_size:
        return []
    return [
        f"--config.rollout.tasks_per_iter={config.rollout.tasks_per_iter}: each iteration draws that many "
        f"distinct tasks, but the training pool ({source}) holds {train_pool_size}; lower it or enlarge the pool"
    ]


def _warmstart_errors(config: ConfigDict, family) -> list[str]:
    """Warm-start settings that would fail or do nothing only once the warm start begins."""
    ws, errors = config.warmstart, []
    needs_expert = ws.steps > 0 or not (config.model.path or config.tokenizer.path)
    if needs_expert and not family.has_expert:
        what = (
            "--config.warmstart.steps > 0" if ws.steps > 0 else "a random model's tokenizer (no model.path)"
        )
        errors.append(f"--config.env.name={family.name!r} has no expert to play, which {what} needs")
    if ws.own_games and ws.n_games < 1:
        errors.append(
            "--config.warmstart.own_games=True needs --config.warmstart.n_games >= 1 (games to play)"
        )
    if ws.own_games and config.env.train_split not in family.generated_splits:
        errors.append(
            f"--config.warmstart.own_games=True: the warm start draws its own games from a generated split "
            f"only; env.train_split={config.env.train_split!r} is real data"
        )
    return errors


def _branch_errors(config: ConfigDict, family) -> list[str]:
    """Branching that would do nothing or cannot be done: a shared prefix as long as every episode (every
    rollout of a group then plays the same answers), or openers the family does not declare."""
    r, errors = config.rollout, []
    if r.branch_at >= config.env.max_steps:
        errors.append(
            f"--config.rollout.branch_at={r.branch_at}: must be below env.max_steps={config.env.max_steps}, "
            "or every rollout of a task group plays the same answers"
        )
    if r.branch_openers and not family.action_openers:
        errors.append(
            f"--config.rollout.branch_openers=True: env.name={family.name!r} declares no action openers "
            "(Family.action_openers)"
        )
    if r.expert_branch and not family.has_expert:
        errors.append(f"--config.rollout.expert_branch=True: env.name={family.name!r} has no expert")
    if r.train_openers and not (r.branch_openers or r.expert_branch):
        errors.append(
            "--config.rollout.train_openers=True: needs rollout.branch_openers or rollout.expert_branch "
            "(nothing is forced)"
        )
    if not r.expert_branch:
        for key, value in (("expert_slots", 1), ("expert_when", "always")):
            if r[key] != value:
                errors.append(f"--config.rollout.{key}={r[key]!r}: needs rollout.expert_branch=True")
        if config.loss.guided != "none":
            errors.append(
                f"--config.loss.guided={config.loss.guided!r}: needs rollout.expert_branch=True (no row holds "
                "the expert's step)"
            )
    elif r.expert_slots >= r.group_size:
        errors.append(
            f"--config.rollout.expert_slots={r.expert_slots}: must be below rollout.group_size={r.group_size}, "
            "or no branch of a group plays its own answer"
        )
    return errors


def _mesh_errors(config: ConfigDict) -> list[str]:
    """The mesh's axis sizes, and that they fit the devices there are (as the trainer will build it)."""
    sizes = {axis: config.mesh[axis] for axis in ("data", "fsdp", "tensor")}
    errors = [
        f"--config.mesh.{axis}={size}: must be a positive size or -1 (fill the rest)"
        for axis, size in sizes.items()
        if size == 0 or size < -1
    ]
    if errors:
        return errors
    from roleagent_jax.parallel.sharding import make_mesh

    try:
        make_mesh(**sizes)
    except ValueError as err:
        return [f"--config.mesh: {err}"]
    return []


def _model_errors(config: ConfigDict) -> list[str]:
    """The model and tokenizer directories (headers only), LoRA, and a random model's shape."""
    errors, checkpoint = [], None
    if config.model.path and not Path(config.model.path).is_dir():
        errors.append(f"--config.model.path={config.model.path!r}: directory not found")
    if config.tokenizer.path and not Path(config.tokenizer.path).is_dir():
        errors.append(f"--config.tokenizer.path={config.tokenizer.path!r}: directory not found")
    if config.model.path and Path(config.model.path).is_dir():
        from roleagent_jax.models.hf_io import check_pretrained

        try:
            checkpoint = check_pretrained(config.model.path)
        except (ValueError, FileNotFoundError) as err:
            errors.append(f"--config.model.path={config.model.path!r}: {err}")
    tokenizer_key = "tokenizer.path" if config.tokenizer.path else "model.path"
    tokenizer_dir = config.tokenizer.path or config.model.path
    if tokenizer_dir and Path(tokenizer_dir).is_dir():
        from roleagent_jax.models.tokenizer import check_tokenizer_dir

        try:
            check_tokenizer_dir(tokenizer_dir)
        except (ValueError, FileNotFoundError) as err:
            errors.append(f"--config.{tokenizer_key}={tokenizer_dir!r}: {err}")
    from roleagent_jax.models.lora import LoRAConfig

    try:
        lora = LoRAConfig(**config.lora.to_dict())
    except (ValueError, TypeError) as err:
        lora = None
        errors.append(f"--config.{err}{_targets_hint(config.lora.targets)}")
    from roleagent_jax.models import init_config

    m = config.model
    try:  # checked with model.path too: a value that cannot be right is refused, never ignored
        init_config(m.init.to_dict(), 1, param_dtype=m.param_dtype, dtype=m.dtype)
    except (ValueError, TypeError) as err:
        errors.append(f"--config.model.init: {err}")
    else:
        errors += _ignored_init_errors(config, checkpoint) if checkpoint else []
        if lora is not None and lora.rank and (checkpoint or not config.model.path):
            errors += _lora_layer_errors(config, lora, checkpoint)
    return errors


def _lora_layer_errors(config: ConfigDict, lora, checkpoint) -> list[str]:
    """`lora.layers` against the layer count of the model it adapts (its config.json, or model.init)."""
    if checkpoint:
        layers, source = checkpoint.num_hidden_layers, f"{Path(config.model.path) / 'config.json'}"
    else:
        layers, source = config.model.init.num_hidden_layers, "--config.model.init.num_hidden_layers"
    try:
        lora.first_layer(layers)
    except ValueError as err:
        return [f"--config.{err} ({source})"]
    return []


def _ignored_init_errors(config: ConfigDict, model_config) -> list[str]:
    """`model.init.*` values that model.path would silently ignore: set (not the declared default) and
    unlike the checkpoint's own config.json (a config that sets the sizes its checkpoint has is fine)."""
    defaults = dict(lookup(CONFIG.build(), "model.init"))
    errors = []
    for key, value in config.model.init.items():
        own = getattr(model_config, key, value)
        if value != defaults.get(key) and value != own:
            errors.append(
                f"--config.model.init.{key}={value!r} is ignored with --config.model.path="
                f"{config.model.path!r} (its config.json has {own!r}): leave model.init unset with a "
                "checkpoint"
            )
    return errors[:1]


def _targets_hint(targets) -> str:
    """How to write several LoRA targets when they came as one string ("q,v" is one name to the flag
    parser): the tuple form that works, built from the names given."""
    names = [n for t in targets for n in re.split(r"[\s,()\[\]'\"]+", str(t)) if n]
    if len(names) <= len(targets):
        return ""
    return f'; several targets are a tuple: --config.lora.targets="{tuple(names)!r}"'


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


def renamed_key_error(dotted: str) -> str | None:
    """The one-line refusal of a renamed key, naming the key that replaced it (None for any other)."""
    new = RENAMED.get(dotted)
    return f"--config.{dotted} was renamed: set --config.{new} instead" if new else None


def _renamed_errors(config: ConfigDict) -> list[str]:
    errors = []
    for old in RENAMED:
        parent, _, name = old.rpartition(".")
        try:
            node = lookup(config, parent) if parent else config
        except (KeyError, AttributeError):
            continue
        if name in node:
            errors.append(renamed_key_error(old))
    return errors


def validate(config: ConfigDict) -> ConfigDict:
    """Raise ValueError naming the key, the bad value and what is allowed; return the config (with
    ``~`` expanded in its paths)."""
    config = expand_paths(config)
    errors = _renamed_errors(config) + startup_errors(config) + CONFIG.errors(config)
    mini, micro = config.train.mini_batch_rows, config.train.micro_batch_rows
    if micro >= 1 and mini % micro:
        errors.append(f"--config.train.mini_batch_rows={mini} must be a multiple of micro_batch_rows={micro}")
    if config.train.pack_rows and config.loss.agg != "token-mean":
        errors.append(f"--config.train.pack_rows=True needs loss.agg=token-mean, not {config.loss.agg!r}: "
                      "a packed grid row holds several rows")  # fmt: skip
    if errors:
        raise ValueError("invalid configuration:\n  " + "\n  ".join(errors))
    return config


def apply_algo(config: ConfigDict) -> ConfigDict:
    """A copy of the config with its algorithm's preset (`keys.ALGO_PRESETS`) set over it."""
    config = ConfigDict(config.to_dict())
    for dotted, value in ALGO_PRESETS[config.algo].items():
        parent, _, name = dotted.rpartition(".")
        lookup(config, parent)[name] = value
    return config
