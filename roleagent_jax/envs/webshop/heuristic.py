"""A deterministic failure analyser for WebShop trajectories (AIW's labeller when the policy is small).

It reads only what the trajectory shows: the actions, the pages they led to, and the done page's
reward details (product type, attributes, options, price). Rules are tried in order, root causes
before their symptoms (keywords that missed the product explain buying the wrong one); the first hit
labels the episode. Lessons and queries name the task pattern (the goal's category), never the product.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from roleagent_jax.envs.rules import Hit, analyse_by_rules
from roleagent_jax.envs.webshop.engine import (
    BACK_TO_SEARCH,
    BUY_NOW,
    NEXT_PAGE,
    PREV_PAGE,
    SUB_PAGES,
    content_words,
    goal_words,
    split_action,
)
from roleagent_jax.envs.webshop.taxonomy import LESSONS
from roleagent_jax.types import FailureReport, Trajectory

_DETAIL = re.compile(
    r"product type: ([\d.]+).*?attributes matched: (\d+)/(\d+).*?options matched: (\d+)/(\d+).*?"
    r"price within limit: (yes|no)",
    re.DOTALL,
)
SEARCH_OVERLAP = 0.5  # a search sharing less than this share of the goal's words missed the product


@dataclass
class _Facts:
    goal_words: set[str]
    n_steps: int
    max_steps: int
    invalid: list[int] = field(default_factory=list)  # 1-based steps without a valid action
    searches: list[tuple[int, str]] = field(default_factory=list)
    page_turns: list[int] = field(default_factory=list)
    opened: list[tuple[int, str]] = field(default_factory=list)  # product clicks
    sub_pages: list[int] = field(default_factory=list)
    option_clicks: list[tuple[int, str]] = field(default_factory=list)  # since the last product opened
    buy_step: int | None = None
    details: tuple | None = None  # (r_type, attrs, attrs_total, opts, opts_total, price_ok)


def _page(obs: str) -> str:
    if obs.startswith("Thank you for shopping"):
        return "done"
    if obs.startswith("Back to Search [SEP] Page "):
        return "results"
    if obs.endswith("Buy Now"):
        return "item"
    if obs.startswith("Back to Search [SEP] < Prev"):
        return "sub"
    return "search"


def _facts(traj: Trajectory, max_steps: int) -> _Facts:
    f = _Facts(set(content_words(goal_words(traj.goal))), len(traj.steps), max_steps)
    for i, s in enumerate(traj.steps, 1):
        if not s.valid:
            f.invalid.append(i)
        parsed = split_action(s.action or "")
        before, after = _page(s.observation or ""), _page(s.next_observation or "")
        if parsed is None:
            continue
        kind, arg = parsed
        arg = arg.lower()
        if kind == "search" and after == "results":
            f.searches.append((i, arg))
        elif kind != "click" or after == before == "search":
            continue
        elif arg in (NEXT_PAGE, PREV_PAGE) and before == after == "results":
            f.page_turns.append(i)
        elif before == "results" and after == "item":
            f.opened.append((i, arg))
            f.option_clicks = []
        elif before == "item" and after == "sub" and arg in SUB_PAGES:
            f.sub_pages.append(i)
        elif before == after == "item" and arg not in (BACK_TO_SEARCH, PREV_PAGE, BUY_NOW):
            f.option_clicks.append((i, arg))
        elif arg == BUY_NOW and after == "done":
            f.buy_step = i
            m = _DETAIL.search(s.next_observation.replace(" [SEP] ", "\n"))
            if m:
                r, a, at, o, ot, p = m.groups()
                f.details = (float(r), int(a), int(at), int(o), int(ot), p == "yes")
    return f


def _format_error(f: _Facts) -> Hit | None:
    bad = f.invalid
    if not bad:
        return None
    streak = best = 1
    start = best_start = bad[0]
    for a, b in zip(bad, bad[1:]):
        streak, start = (streak + 1, start) if b == a + 1 else (1, b)
        if streak > best:
            best, best_start = streak, start
    if best >= 3 or len(bad) >= max(3, 0.3 * f.n_steps):
        return best_start, f"{len(bad)} of {f.n_steps} responses had no valid action"
    return None


def _no_search(f: _Facts) -> Hit | None:
    if f.searches or f.buy_step is not None:
        return None
    return 1, "never searched"


def _overlap(f: _Facts, keywords: str) -> float:
    return len(set(content_words(keywords)) & f.goal_words) / max(len(f.goal_words), 1)


def _wrong_search_terms(f: _Facts) -> Hit | None:
    if not f.searches or (f.details is not None and f.details[0] >= 1.0):
        return None
    best = max(f.searches, key=lambda s: _overlap(f, s[1]))
    share = _overlap(f, best[1])
    if share < SEARCH_OVERLAP:
        return f.searches[0][0], f"the best search '{best[1]}' shares {share:.0%} of the instruction's words"
    return None


def _wrong_item(f: _Facts) -> Hit | None:
    if f.details is None or f.details[0] >= 1.0:
        return None
    step = f.opened[-1][0] if f.opened else f.buy_step
    return step, f"bought a product of another type (type score {f.details[0]})"


def _missing_attribute(f: _Facts) -> Hit | None:
    if f.details is None or f.details[1] >= f.details[2]:
        return None
    step = f.opened[-1][0] if f.opened else f.buy_step
    return step, f"the product bought has {f.details[1]} of the {f.details[2]} attributes asked for"


def _options(f: _Facts, chosen_enough: bool) -> Hit | None:
    if f.details is None or f.details[3] >= f.details[4]:
        return None
    enough = len({a for _, a in f.option_clicks}) >= f.details[4]
    if enough != chosen_enough:
        return None
    if chosen_enough:
        step = f.option_clicks[0][0] if f.option_clicks else f.buy_step
        return step, f"chose options matching {f.details[3]} of the {f.details[4]} asked for"
    return f.buy_step, f"bought after choosing {len(f.option_clicks)} of {f.details[4]} options"


def _over_budget(f: _Facts) -> Hit | None:
    if f.details is None or f.details[5]:
        return None
    step = f.opened[-1][0] if f.opened else f.buy_step
    return step, "bought above the price limit"


def _paging_loop(f: _Facts) -> Hit | None:
    if f.buy_step is not None or len(f.page_turns) < 4:
        return None
    return f.page_turns[0], f"turned result pages {len(f.page_turns)} times"


def _item_hopping(f: _Facts) -> Hit | None:
    if f.buy_step is not None:
        return None
    distinct = len({a for _, a in f.opened})
    if distinct >= 3 or len(f.sub_pages) >= 3:
        return f.opened[0][0] if f.opened else f.sub_pages[0], (
            f"opened {distinct} products and {len(f.sub_pages)} sub-pages without buying"
        )
    return None


def _never_bought(f: _Facts) -> Hit | None:
    if f.buy_step is not None:
        return None
    return f.n_steps, f"no purchase in {f.n_steps} of {f.max_steps} steps"


RULES: dict[str, Callable[[_Facts], Hit | None]] = {
    "action_format_error": _format_error,
    "no_search": _no_search,
    "wrong_search_terms": _wrong_search_terms,
    "wrong_item": _wrong_item,
    "missing_attribute": _missing_attribute,
    "option_not_chosen": lambda f: _options(f, chosen_enough=False),
    "wrong_option": lambda f: _options(f, chosen_enough=True),
    "over_budget": _over_budget,
    "paging_loop": _paging_loop,
    "item_hopping": _item_hopping,
    "never_bought": _never_bought,
}
RULE_ORDER = tuple(RULES)


def pattern_name(task_type: str) -> str:
    return f"{task_type.replace('_', ' ').strip() or 'product'} purchase"


def analyse(traj: Trajectory, max_steps: int = 15) -> FailureReport:
    """Label a failed trajectory with the first matching rule of RULE_ORDER (``unknown`` if none)."""
    return analyse_by_rules(
        RULES.items(),
        _facts(traj, max_steps),
        LESSONS,
        {"p": pattern_name(traj.task_type)},
        won=traj.won,
        env_failed=traj.env_failed,
    )
