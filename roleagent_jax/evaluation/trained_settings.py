"""What an exported model was trained and evaluated with: `roleagent.json` beside its weights.

The trainer writes it into every model it exports (`hf_warmstart`, `hf_final`); `evaluate --checkpoint`
reads it, so a run's model is evaluated on the same tasks, with the same prompts and decoding, as the
run evaluated it. JAX-free: the evaluation command reads it before deciding to load a model.

    {"history_k", "max_prompt_tokens", "max_response_tokens",          the prompt (always present)
     "max_rows_per_call",                                               the sampler's largest call
     "env": {"name", "options", "max_steps", "eval_splits", "gen_n", "gen_seed", "data_dir"},
     "eval": {"greedy", "temperature", "limit", "seed", "batch_size"}}

Files written before "env" and "eval" existed hold only the prompt settings; readers fall back to
their own defaults for the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roleagent_jax.config import CONFIG, Key
from roleagent_jax.config.schema import lookup, option_errors
from roleagent_jax.envs.registry import get_family, registered

SETTINGS_FILE = "roleagent.json"
# What the policy needs to prompt and sample as the run did, each the config key it is exported from,
# and its declared default. The sampler's row cap travels too: a run that needed it to fit in memory
# (192 greedy questions in one call held 14 GB) needs it again when its model is evaluated alone.
POLICY_KEYS = {
    "history_k": "env.history_k",
    "max_prompt_tokens": "rollout.max_prompt_tokens",
    "max_response_tokens": "rollout.max_response_tokens",
    "max_rows_per_call": "rollout.max_rows_per_call",
}
POLICY_DEFAULTS = {name: CONFIG.default(key) for name, key in POLICY_KEYS.items()}
# Every checked field of the file ("section.name"), with the declared key whose check it takes.
_KEYS = dict(CONFIG.keys())
FIELD_KEYS = {
    **{name: _KEYS[key] for name, key in POLICY_KEYS.items()},
    **{f"env.{name}": _KEYS[key] for name, key in (("name", "env.name"), ("max_steps", "env.max_steps"),
       ("eval_splits", "env.eval_splits"), ("gen_n", "env.gen.n_eval"), ("gen_seed", "env.gen.seed"),
       ("data_dir", "env.data_dir"))},
    **{f"eval.{name}": _KEYS[key] for name, key in (("greedy", "eval.greedy"),
       ("temperature", "eval.temperature"), ("limit", "eval.limit"), ("seed", "seed"))},
    "eval.batch_size": Key("batch_size", 0, "episodes played at once (0 = all)", ge=0),
}  # fmt: skip
# Each purpose of a run's generated games draws its own seed offset, so evaluation's games are held out.
GEN_SEED_OFFSETS = {"train": 0, "eval": 1000, "warmstart": 2000}
EVAL_KEY_OFFSET = 17  # the run's evaluation samples with PRNGKey(seed + this)


def run_settings(config: Any, options: Mapping[str, Any]) -> dict:
    """The settings of a run's config (`options`: its family's resolved `env.<family>`) as exported."""
    c = config
    return {
        **{name: lookup(c, key) for name, key in POLICY_KEYS.items()},
        "env": {
            "name": c.env.name,
            "options": jsonable(dict(options)),
            "max_steps": c.env.max_steps,
            "eval_splits": list(
                (c.env.eval_splits,) if isinstance(c.env.eval_splits, str) else c.env.eval_splits
            ),
            "gen_n": c.env.gen.n_eval,
            "gen_seed": c.env.gen.seed + GEN_SEED_OFFSETS["eval"],
            "data_dir": c.env.data_dir,
        },
        "eval": {
            "greedy": c.eval.greedy,
            "temperature": c.eval.temperature,
            "limit": c.eval.limit,
            "seed": c.seed + EVAL_KEY_OFFSET,
            "batch_size": 0,  # the run plays a split's games all at once
        },
    }


def jsonable(value: Any) -> Any:
    """Options as JSON holds them: mappings as dicts, tuples (ranges, lists of names) as lists."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def write_settings(directory: str | os.PathLike, settings: Mapping[str, Any]) -> None:
    """`roleagent.json` in `directory`, written as the folder's other files are (umask respected)."""
    (Path(directory) / SETTINGS_FILE).write_text(json.dumps({**POLICY_DEFAULTS, **settings}, indent=1) + "\n")


def read_settings(directory: str | os.PathLike) -> dict:
    """The settings a model directory carries ({} when it has none), each field checked as the config
    key it was exported from; ValueError naming the file and the first field that is broken."""
    path = Path(directory) / SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not valid JSON ({' '.join(str(err).split())})") from err
    problem = settings_error(settings)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return settings


def settings_error(settings: Any) -> str | None:
    """The first field of a settings file's contents that is missing its shape, type or range (every
    field is optional: older files hold fewer), or None."""
    if not isinstance(settings, dict):
        return "expected a JSON object"
    for section in ("env", "eval"):
        if not isinstance(settings.get(section, {}), dict):
            return f"{section}={settings[section]!r}: must be a JSON object"
    for field, key in FIELD_KEYS.items():
        section, _, name = field.rpartition(".")
        node = settings.get(section, {}) if section else settings
        if name in node:
            problem = key.problem(node[name])
            if problem:
                return f"{field}={node[name]!r}: {problem}"
    env = settings.get("env", {})
    if "name" in env and env["name"] not in registered():
        return f"env.name={env['name']!r}: must be one of {', '.join(registered())}"
    if "options" in env:
        return _options_error(env["name"] if "name" in env else None, env["options"])
    return None


def _options_error(family_name: str | None, options: Any) -> str | None:
    """The family's own checks of the options the run played with (JSON lists read back as ranges)."""
    if not isinstance(options, dict):
        return f"env.options={options!r}: must be a JSON object"
    if family_name is None:
        return None  # no family to check them against: evaluate then plays with its own defaults
    errors = option_errors(
        get_family(family_name), {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()},
        lambda name: f"env.options.{name}", "env.options",
    )  # fmt: skip
    return errors[0] if errors else None


def check_checkpoint(path: Path) -> None:
    """FileNotFoundError in one line when `path` holds no model: an adapter-only folder names its base."""
    if (path / "config.json").is_file():
        return
    adapter = path / "adapter_config.json"
    if adapter.is_file():
        base = read_adapter_base(adapter)
        merged = path.parent if (path.parent / "config.json").is_file() else None
        hint = f"evaluate {merged}, the merged model written beside it" if merged else "evaluate a full model"
        raise FileNotFoundError(
            f"{path} holds LoRA adapters only (adapter_config.json), for the base model {base}: {hint}"
        )
    raise FileNotFoundError(
        f"no model checkpoint at {path}: expected a Hugging Face directory with config.json and "
        "*.safetensors (e.g. <workdir>/hf_final written at the end of training)"
    )


def read_adapter_base(adapter_config: Path) -> str:
    """The base model an adapter's config names (peft's `base_model_name_or_path`), or "(not named)"."""
    try:
        base = json.loads(adapter_config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        base = None
    return str(base) if base else "(not named)"
