"""The run's settings: every key declared once with its default, check and meaning (`keys.py`), the
checks that run at start-up (`checks.py`), and the algorithm presets.

`python -m roleagent_jax.config` lists every key.
"""

from roleagent_jax.config.checks import (
    PATH_KEYS,
    apply_algo,
    expand_paths,
    renamed_key_error,
    startup_errors,
    validate,
)
from roleagent_jax.config.keys import ALGO_PRESETS, ALGOS, CONFIG, RENAMED
from roleagent_jax.config.schema import FamilyOptions, IntRange, Key, Section, family_options

__all__ = [
    "ALGOS",
    "ALGO_PRESETS",
    "CONFIG",
    "PATH_KEYS",
    "RENAMED",
    "FamilyOptions",
    "IntRange",
    "Key",
    "Section",
    "apply_algo",
    "expand_paths",
    "family_options",
    "renamed_key_error",
    "startup_errors",
    "validate",
]
