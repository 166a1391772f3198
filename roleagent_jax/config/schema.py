"""How a config key is declared: its default, its check and its meaning in one place (`Key`), grouped in
`Section`s. The sections build the ConfigDict a config file starts from and run the checks at start-up,
so a new setting is one line and cannot drift from its check."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from absl import flags
from ml_collections import ConfigDict, config_flags

from roleagent_jax.envs.base import Family
from roleagent_jax.envs.registry import get_family, registered


@dataclass(frozen=True)
class Key:
    """One setting: `default` (its type is the key's type), `meaning` (one line), and its check:
    `choices`, or bounds `ge` / `gt` (lower, inclusive / exclusive) and `le` (upper). `why` says what a
    value out of bounds would break, and is part of the refusal."""

    name: str
    default: Any
    meaning: str
    choices: tuple | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    why: str = ""

    def rule(self) -> str:
        """The check in words ("" when only the type is checked)."""
        if self.choices is not None:
            return f"one of {', '.join(map(str, self.choices))}"
        low = f">= {self.ge}" if self.ge is not None else f"> {self.gt}" if self.gt is not None else ""
        high = f"<= {self.le}" if self.le is not None else ""
        return " and ".join(part for part in (low, high) if part)

    def error(self, dotted: str, value: Any) -> str | None:
        """The one-line refusal of `value`, or None when it passes."""
        problem = self.problem(value)
        return f"--config.{dotted}={value!r}: {problem}" if problem else None

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be ..."), or None: the check for a value read from elsewhere
        (an exported model's settings file) than the command line."""
        if not _same_type(value, self.default):
            return f"must be {_type_name(self.default)}"
        if self.choices is not None:
            return None if value in self.choices else f"must be {self.rule()}"
        low_ok = (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
        if low_ok and (self.le is None or value <= self.le):
            return None
        return f"must be {self.rule()}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Section:
    """A group of keys under one name (`name` "" is the top level); entries are Keys, Sections or
    `FamilyOptions`."""

    name: str
    meaning: str
    entries: Sequence[Key | Section | FamilyOptions] = field(default_factory=tuple)

    def build(self) -> ConfigDict:
        node = ConfigDict()
        for entry in self.entries:
            if isinstance(entry, FamilyOptions):
                for name, options in entry.build().items():
                    node[name] = options
            else:
                node[entry.name] = entry.build() if isinstance(entry, Section) else entry.default
        return node

    def keys(self, prefix: str = "") -> Iterator[tuple[str, Key]]:
        """Every declared key with its dotted name."""
        for entry in self.entries:
            if isinstance(entry, Section):
                yield from entry.keys(f"{prefix}{entry.name}.")
            elif isinstance(entry, Key):
                yield f"{prefix}{entry.name}", entry

    def default(self, dotted: str) -> Any:
        """The declared default of one key, e.g. "rollout.backend" (for code that runs without a config)."""
        return dict(self.keys())[dotted].default

    def errors(self, config: ConfigDict) -> list[str]:
        """Each declared key's refusal (type, choices, bounds), in declaration order."""
        found = (key.error(dotted, lookup(config, dotted)) for dotted, key in self.keys())
        return [message for message in found if message]

    def describe(self, prefix: str = "") -> Iterator[str]:
        """One line per key: name, default, check, meaning; sections introduced by their meaning."""
        for entry in self.entries:
            if isinstance(entry, Section):
                yield f"\n{prefix}{entry.name}: {entry.meaning}"
                yield from entry.describe(f"{prefix}{entry.name}.")
            elif isinstance(entry, FamilyOptions):
                yield f"{prefix}<family>.*{'':24s} {entry.meaning}"
                for name in registered():
                    opts = ", ".join(f"{k}={v!r}" for k, v in get_family(name).gen_options.items())
                    yield f"  {prefix}{name}: {opts}"
            else:
                check = f"  [{entry.rule()}]" if entry.rule() else ""
                yield f"{prefix}{entry.name} = {entry.default!r}{check}  {entry.meaning}"


def lookup(config: ConfigDict, dotted: str) -> Any:
    """The value (or subtree) at a dotted key, e.g. "rollout.group_size"."""
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


class IntRange(tuple):
    """A family option that is an int or an inclusive (lo, hi) range (ALFWorld's room sizes). Its own
    command-line parser reads `6` as 6 and `4,6` as (4, 6): the plain tuple parser would make (6,)."""


class _IntRangeParser(flags.ArgumentParser):
    def parse(self, argument: Any) -> int | IntRange:
        try:
            value = ast.literal_eval(argument) if isinstance(argument, str) else argument
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, tuple | list) and len(value) == 2 and all(type(v) is int for v in value):
            return IntRange(value)
        raise ValueError(f"{argument!r} is neither an int nor a pair lo,hi of ints")

    def flag_type(self) -> str:
        return "int or lo,hi"


config_flags.register_flag_parser_for_type(IntRange, _IntRangeParser())


@dataclass(frozen=True)
class FamilyOptions:
    """`env.<name>` for every registered family: its `gen_options`, so the config and the family (and the
    standalone evaluator, which reads the family) share one set of defaults. The subtrees are not
    type-locked, as a range option takes an int too; `errors` checks the types instead."""

    meaning: str

    def build(self) -> dict[str, ConfigDict]:
        return {name: _family_tree(get_family(name)) for name in registered()}

    @staticmethod
    def errors(config: ConfigDict, family: Family) -> list[str]:
        """The selected family's options (`option_errors`), named as config keys."""
        section = f"--config.env.{family.name}"
        return option_errors(
            family, family_options(config, family), lambda name: f"{section}.{name}", section
        )


def option_errors(
    family: Family, options: Mapping[str, Any], flag: Callable[[str], str], section: str
) -> list[str]:
    """The refusal of a family's options, wherever they came from (config, evaluate's flags, an exported
    model's settings): the first option whose type is not its default's (named `flag(option)`), else an
    unknown option or the family's own `check_options` (named `section`)."""
    for name, value in options.items():
        default = family.gen_options.get(name)
        if name in family.gen_options and not _option_type_ok(value, default):
            return [f"{flag(name)}={value!r}: must be {_type_name(default)}"]
    try:
        family.check_options(family.resolve_options(options))
    except (ValueError, TypeError) as err:
        return [f"{section}: {err}"]
    return []


def family_options(config: ConfigDict, family: Family) -> dict:
    """The family's own settings: the config's `env.<family name>` subtree when it has one (ranges as
    plain tuples)."""
    node = config.env.get(family.name)
    options = dict(node.to_dict()) if node is not None else {}
    return {k: tuple(v) if isinstance(v, IntRange) else v for k, v in options.items()}


def _family_tree(family: Family) -> ConfigDict:
    options = {k: IntRange(v) if _is_range(v) else v for k, v in family.gen_options.items()}
    return ConfigDict(options, type_safe=False)


def _is_range(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(type(v) is int for v in value)


def _option_type_ok(value: Any, default: Any) -> bool:
    if _is_range(default):
        return (type(value) is int) or _is_range(tuple(value) if isinstance(value, list) else value)
    if isinstance(default, Mapping):
        return isinstance(value, Mapping)
    return _same_type(value, default)


def _same_type(value: Any, default: Any) -> bool:
    """ml_collections' own rule: the default's type, an int where a float is declared, a list for a tuple;
    never a bool for a number."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, tuple):
        return isinstance(value, tuple | list)
    return isinstance(value, type(default))


def _type_name(default: Any) -> str:
    if _is_range(default):
        return "an int or a pair lo,hi of ints"
    return {bool: "True or False", int: "an integer", float: "a number", str: "a string"}.get(
        type(default), f"a {type(default).__name__}"
    )
