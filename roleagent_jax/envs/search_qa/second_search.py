"""Whether an episode searched a second time where its question needs it: search QA's behaviour rates.

Some questions need a second search (a bridge whose first search's passages lack the answer, a
comparison of two entities); a model that searches once and answers fails them. A task needs one when
its expert's plan (the responses the expert played to win it) holds two or more searches; an episode
made one when its played actions hold two or more. An action counts as a search exactly when the env
plays it as one: it parses to a `<search>` turn. Pure: no env, no retriever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from roleagent_jax.envs.search_qa.parser import SEARCH, parse_turn
from roleagent_jax.types import Trajectory


def count_searches(actions: Iterable[str | None]) -> int:
    """How many of `actions` (responses or canonical actions; None for a step where nothing parsed) the
    env plays as a search."""
    return sum(parse_turn(a).kind == SEARCH for a in actions)


def second_search_rates(trajs: Sequence[Trajectory], plans: Mapping[int, Sequence[str]]) -> dict[str, float]:
    """The second-search rates of `trajs`, each task's expert plan in `plans` (task id -> plan).

    second_search_needed       share of the episodes whose task needs a second search that searched at
                               least twice (left out when there is no such episode)
    second_search_not_needed   the same over the episodes whose task needs one search or none
    needs_second_search        how many episodes had a task that needs a second search (an int)
    needs_no_second_search     how many had one that does not (an int)

    Episodes whose task has no plan (real data sets) or whose environment failed are left out; {} when
    none is left."""
    made: dict[bool, list[bool]] = {True: [], False: []}
    for t in trajs:
        plan = plans.get(t.task_id)
        if plan is None or t.env_failed:
            continue
        made[count_searches(plan) >= 2].append(count_searches(s.action for s in t.steps) >= 2)
    if not made[True] and not made[False]:
        return {}
    groups = {"second_search_needed": made[True], "second_search_not_needed": made[False]}
    out = {name: sum(v) / len(v) for name, v in groups.items() if v}
    out["needs_second_search"] = len(made[True])
    out["needs_no_second_search"] = len(made[False])
    return out
