"""The rule runner behind every family's heuristic failure analyser (`envs/<family>/heuristic.py: analyse`).

A family reads a trajectory into facts once and lists its rules in the order they are tried, root causes
before their symptoms; the first rule that fires labels the episode. Keeping the loop and the report in
one place makes every family label, explain and template its failures the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from roleagent_jax.types import UNKNOWN, FailureReport

F = TypeVar("F")

Hit = tuple[int | None, str]
"""What a rule returns when it fires: the 1-based critical step (None: no single step) and a detail."""


def analyse_by_rules(
    rules: Iterable[tuple[str, Callable[[F], Hit | None]]],
    facts: F,
    templates: Mapping[str, tuple[str, str]],
    fields: Mapping[str, str],
    *,
    won: bool,
    env_failed: bool,
) -> FailureReport:
    """The heuristic report of the first (type, rule) of `rules` that fires on `facts`; `unknown` when
    none does. A won episode or one the environment broke is no agent failure, so no rule runs on it.
    The lesson and query are the type's `templates` entry (`unknown` included) filled with `fields`."""
    failure_type, hit = UNKNOWN, None
    if not won and not env_failed:
        for name, rule in rules:
            hit = rule(facts)
            if hit is not None:
                failure_type = name
                break
    step, detail = hit if hit else (None, "episode won" if won else "no rule matched")
    if env_failed:
        detail = "the environment failed; not an agent failure"
    lesson, query = templates[failure_type]
    return FailureReport(
        failure_type=failure_type,
        detail=detail,
        critical_step=step,
        lesson=lesson.format(**fields),
        query=query.format(**fields),
        raw="",
        source="heuristic",
    )
