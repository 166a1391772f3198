"""Config files as the training command loads them (`--config=FILE --config.KEY=VALUE`), for it and for
the scripts that run the trainer (the learning benchmark): one loader, and each failure as one line
naming the file, key or value, exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from absl import flags
from ml_collections import ConfigDict, config_flags

from roleagent_jax.config.checks import renamed_key_error

USAGE_EXIT = 2


def error_lines(message: str) -> str:
    """One `error:` line per problem (a config with several bad keys names each on its own line)."""
    lines = message.removeprefix("invalid configuration:\n").split("\n")
    return "\n".join(f"error: {line.strip()}" for line in lines)


def fail(message: str) -> NoReturn:
    """`error_lines(message)` on stderr, exit code 2."""
    print(error_lines(message), file=sys.stderr)
    sys.exit(USAGE_EXIT)


def last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def _mapping_hint(message: str) -> str:
    """How a mapping setting (search QA's env.search_qa.mix) is written, when one failed to parse."""
    if "as a ConfigDict" not in message:
        return ""
    return (
        "; write a mapping as a Python dict, --config.KEY=\"{'name': value, ...}\", or one entry, "
        "--config.KEY.name=value"
    )


def config_error(err: Exception, argv: Sequence[str]) -> str:
    """The one line for a failure to load the config `argv` names: a value that does not parse, a key the
    config does not have (or had: renamed), a file that does not load or has no `get_config`."""
    if isinstance(err, flags.Error):
        return last_line(err) + _mapping_hint(str(err))
    config_file = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if isinstance(err, AttributeError) and "get_config" in str(err):
        return f"--config={config_file}: the file defines no get_config() (it returns the run's ConfigDict)"
    if isinstance(err, AttributeError | KeyError):  # ml_collections: a key the config does not have
        name = str(err).strip("\"'")
        arg = next((a for a in argv if a.startswith("--config.") and name in a), name)
        key = arg.split("=")[0]
        renamed = renamed_key_error(key.removeprefix("--config."))
        return (
            renamed or f"{key}: no such key in {config_file} (python -m roleagent_jax.config lists every key)"
        )
    return f"--config={config_file}: cannot load the config file ({last_line(err)})"


def load_config_file(path: str, overrides: Sequence[str] = ()) -> ConfigDict:
    """The config of the file `path` with `overrides` ("KEY=VALUE", each as --config.KEY=VALUE) set
    over it, parsed and locked as the training command does; ValueError in one line when it fails."""
    argv = ["config", f"--config={path}", *(f"--config.{item}" for item in overrides)]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
    try:
        values(argv)
        config = values["config"].value
        config.to_dict()  # a config file that failed to load raises on first use
    except Exception as err:
        raise ValueError(config_error(err, argv)) from err
    return config
