"""A deterministic failure analyser for search QA (AIW's heuristic analyser, and a labeller).

It reads the trajectory (queries, what came back, the answer) and labels it with the first rule of
RULE_ORDER that fires, root causes first: a format error explains everything after it, answering
without any search explains a wrong answer, a loop of repeated queries explains running out of turns.
Lessons and queries come from templates that name the question pattern, never its entities. Gold
answers, when given, sharpen one rule (verbose_answer); trajectories themselves do not carry them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from roleagent_jax.envs.rules import Hit, analyse_by_rules
from roleagent_jax.envs.search_qa.answers import exact_match, normalize_answer
from roleagent_jax.envs.search_qa.parser import ANSWER, SEARCH, parse_turn
from roleagent_jax.envs.search_qa.taxonomy import SEARCH_QA_TYPES, is_multi_hop, pattern_of
from roleagent_jax.types import UNKNOWN, FailureReport, Trajectory

_TEMPLATES: dict[str, tuple[str, str]] = {
    "format_error": (
        "In a {p}, every turn must be exactly one <search>query</search> or <answer>answer</answer>.",
        "{p}: invalid turn format",
    ),
    "no_search": (
        "In a {p}, search before answering: the facts are only in the corpus.",
        "{p}: answered without searching",
    ),
    "repeated_query": (
        "In a {p}, when a search brought back its passage, search the next entity instead of repeating it.",
        "{p}: repeated the same search",
    ),
    "query_drift": (
        "In a {p}, search for an entity named in the question or in the last results.",
        "{p}: query unrelated to question and results",
    ),
    "out_of_turns": (
        "In a {p}, answer once the last hop's fact is found; turns are limited.",
        "{p}: ran out of turns without answering",
    ),
    "stopped_after_first_hop": (
        "In a {p}, the first result names an intermediate entity: search it before answering.",
        "{p}: answered with the intermediate entity after one hop",
    ),
    "verbose_answer": (
        "In a {p}, answer with the entity alone, no extra words.",
        "{p}: answer had extra words",
    ),
    "wrong_entity": (
        "In a {p}, answer with the entity the question asks for, read from the passage of the last hop.",
        "{p}: answered with the wrong entity from the results",
    ),
    "answer_without_evidence": (
        "In a {p}, answer only with a value the search results state.",
        "{p}: answer not found in any result",
    ),
    UNKNOWN: ("In a {p}, search each hop and answer from the last result.", "{p}: failed"),
}
_STOP = frozenset(
    "a an the of in on at to is was who what which where when how and or for by from with".split()
)
_TOKEN = re.compile(r"[a-z0-9]+")


def _content_words(text: str) -> set[str]:
    return {w for w in _TOKEN.findall(text.lower()) if w not in _STOP and len(w) > 1}


@dataclass
class _Facts:
    kind: str
    question: str
    golds: tuple[str, ...]
    turns: list  # parsed turns, one per step
    results: list[str]  # the observation after each step
    answer: str | None
    answer_step: int | None  # 1-based
    max_turns: int


def _facts(traj: Trajectory, golds: Sequence[str], max_turns: int) -> _Facts:
    turns = [parse_turn(s.action if s.valid and s.action else s.response) for s in traj.steps]
    results = [s.next_observation or "" for s in traj.steps]
    answer, answer_step = None, None
    for i, t in enumerate(turns, 1):
        if t.kind == ANSWER:
            answer, answer_step = t.content, i
            break
    return _Facts(traj.task_type, traj.goal, tuple(golds), turns, results, answer, answer_step, max_turns)


def _searches(f: _Facts) -> list[tuple[int, str, str]]:
    """(1-based step, query, what came back) of every valid search before the answer."""
    end = f.answer_step or len(f.turns) + 1
    return [
        (i, t.content, f.results[i - 1]) for i, t in enumerate(f.turns, 1) if t.kind == SEARCH and i < end
    ]


def _in_results(f: _Facts, text: str) -> bool:
    target = normalize_answer(text)
    return bool(target) and any(target in normalize_answer(r) for _, _, r in _searches(f))


def _format_error(f: _Facts) -> Hit | None:
    bad = [i for i, t in enumerate(f.turns, 1) if not t.valid]
    if bad and (f.answer is None or len(bad) * 2 >= len(f.turns)):
        return bad[0], f"{len(bad)} of {len(f.turns)} turns had no valid <search> or <answer> block"
    return None


def _no_search(f: _Facts) -> Hit | None:
    if f.answer is not None and not _searches(f):
        return f.answer_step, f"answered '{f.answer}' without searching"
    return None


def _repeated_query(f: _Facts) -> Hit | None:
    seen: dict[str, int] = {}
    for i, q, _ in _searches(f):
        key = normalize_answer(q)
        if key in seen:
            return i, f"searched '{q}' again (first at turn {seen[key]})"
        seen[key] = i
    return None


def _query_drift(f: _Facts) -> Hit | None:
    known = _content_words(f.question)
    for i, q, result in _searches(f):
        if not _content_words(q) & known:
            return i, f"query '{q}' shares no word with the question or earlier results"
        known |= _content_words(result)
    return None


def _out_of_turns(f: _Facts) -> Hit | None:
    if f.answer is None and f.turns:
        return len(f.turns), f"used all {len(f.turns)} turns without answering"
    return None


def _stopped_after_first_hop(f: _Facts) -> Hit | None:
    if f.answer is not None and is_multi_hop(f.kind) and len(_searches(f)) == 1:
        return f.answer_step, "answered a multi-hop question after a single search"
    return None


def _verbose_answer(f: _Facts) -> Hit | None:
    if f.answer is None:
        return None
    words = normalize_answer(f.answer)
    for g in f.golds:
        gold = normalize_answer(g)
        if gold and gold != words and re.search(rf"(?:^| ){re.escape(gold)}(?: |$)", words):
            return f.answer_step, f"answer '{f.answer}' contains the gold '{g}' with extra words"
    if not f.golds and len(words.split()) > 6:
        return f.answer_step, f"answer of {len(words.split())} words"
    return None


def _wrong_entity(f: _Facts) -> Hit | None:
    if f.answer is not None and _in_results(f, f.answer):
        return (
            f.answer_step,
            f"answered '{f.answer}', which the results mention, but it is not the asked entity",
        )
    return None


def _answer_without_evidence(f: _Facts) -> Hit | None:
    if f.answer is not None:
        return f.answer_step, f"answered '{f.answer}', which no search result contained"
    return None


RULES: dict[str, Callable[[_Facts], Hit | None]] = {
    "format_error": _format_error,
    "no_search": _no_search,
    "repeated_query": _repeated_query,
    "query_drift": _query_drift,
    "out_of_turns": _out_of_turns,
    "stopped_after_first_hop": _stopped_after_first_hop,
    "verbose_answer": _verbose_answer,
    "wrong_entity": _wrong_entity,
    "answer_without_evidence": _answer_without_evidence,
}
RULE_ORDER = tuple(RULES)
assert set(RULES) == set(SEARCH_QA_TYPES)


def analyse(traj: Trajectory, max_steps: int = 4, golds: Sequence[str] = ()) -> FailureReport:
    """Label a failed search-QA trajectory (at most `max_steps` turns) with the first rule of RULE_ORDER
    that fires (or unknown); an answer matching `golds` counts as won."""
    f = _facts(traj, golds, max_steps)
    won = traj.won or (f.answer is not None and bool(golds) and exact_match(f.answer, golds) == 1.0)
    fields = {"p": pattern_of(traj.task_type)}
    return analyse_by_rules(RULES.items(), f, _TEMPLATES, fields, won=won, env_failed=traj.env_failed)
