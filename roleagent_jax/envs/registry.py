"""The families a config can name: the built-in ones, imported on first lookup (so importing
`roleagent_jax.envs` loads no engine), and those registered at run time (tests, user code)."""

from __future__ import annotations

import importlib

from roleagent_jax.envs.base import Family

# Built-in families are imported on first lookup, so importing `roleagent_jax.envs` loads no engine.
_BUILTIN: dict[str, str] = {
    "alfworld": "roleagent_jax.envs.alfworld.family:AlfWorld",
    "webshop": "roleagent_jax.envs.webshop.family:WebShop",
    "search_qa": "roleagent_jax.envs.search_qa.family:SearchQA",
}
_REGISTRY: dict[str, Family] = {}


def register(family: Family, *, replace: bool = False) -> Family:
    """Make `family` selectable as `config.env.name = family.name`; returns it.

    Registering a second family under a taken name raises ValueError unless `replace=True`."""
    if not isinstance(family, Family):
        raise TypeError(f"register() needs a Family instance, got {type(family).__name__}")
    if not family.name or not family.task_types:
        raise ValueError(f"{type(family).__name__} must set `name` and `task_types`")
    taken = family.name in _REGISTRY or family.name in _BUILTIN
    if taken and not replace and _REGISTRY.get(family.name) is not family:
        raise ValueError(f"an environment family named {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    """Forget a registered family (tests that register their own clean up with this)."""
    _REGISTRY.pop(name, None)


def registered() -> tuple[str, ...]:
    """The names of every known family, sorted (built-in ones even before their first lookup)."""
    return tuple(sorted(set(_BUILTIN) | set(_REGISTRY)))


def get_family(name: str) -> Family:
    """The family registered as `name`; ValueError naming the known families when there is none."""
    if name not in _REGISTRY and name in _BUILTIN:
        module, attr = _BUILTIN[name].split(":")
        register(getattr(importlib.import_module(module), attr)(), replace=True)
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(registered())}")
    return _REGISTRY[name]
