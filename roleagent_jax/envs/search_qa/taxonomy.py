"""The failure taxonomy of search QA: nine types with glosses, the words small models use for them,
and the question patterns AIW's retrieval groups tasks by.

The types come from how episodes in this environment go wrong (`heuristic.py` holds the rule that
detects each). Patterns name how a question must be solved ("two-hop bridge question"), never its
entities, so retrieval pulls questions that need the same steps. Nothing here imports AIW or JAX.
"""

from __future__ import annotations

import re

from roleagent_jax.envs.search_qa.questions import MULTI_HOP_KINDS
from roleagent_jax.envs.search_qa.tasks import DATASETS

SEARCH_QA_TYPES: dict[str, str] = {
    "format_error": "turns without a valid <search> or <answer> block",
    "no_search": "answered from memory without searching at all",
    "repeated_query": "searched the same query again and got nothing new",
    "query_drift": "searched for something the question and the results never mention",
    "out_of_turns": "kept searching and never gave an answer",
    "stopped_after_first_hop": "answered a multi-hop question after one search, with an intermediate fact",
    "verbose_answer": "the answer holds the right entity but adds words, so it does not match exactly",
    "wrong_entity": "answered with an entity from the results that is not the asked one",
    "answer_without_evidence": "answered with something no search result contained",
}

# Phrases small models use for a type instead of its name (checked after exact and fuzzy matching).
FAILURE_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("format", "format_error"),
    ("tag", "format_error"),
    ("invalid", "format_error"),
    ("without_search", "no_search"),
    ("no_search", "no_search"),
    ("memory", "no_search"),
    ("repeat", "repeated_query"),
    ("same_query", "repeated_query"),
    ("drift", "query_drift"),
    ("irrelevant", "query_drift"),
    ("unrelated", "query_drift"),
    ("turns", "out_of_turns"),
    ("never_answer", "out_of_turns"),
    ("first_hop", "stopped_after_first_hop"),
    ("intermediate", "stopped_after_first_hop"),
    ("one_hop", "stopped_after_first_hop"),
    ("verbose", "verbose_answer"),
    ("extra_word", "verbose_answer"),
    ("wrong_entity", "wrong_entity"),
    ("wrong_person", "wrong_entity"),
    ("hallucinat", "answer_without_evidence"),
    ("evidence", "answer_without_evidence"),
    ("not_in_results", "answer_without_evidence"),
)
# task type -> distinctive words of its pattern (AIW's fuzzy retrieval)
PATTERN_KEYWORDS: dict[str, tuple[str, ...]] = {
    "single_hop": ("single-hop", "one search", "single hop"),
    "bridge": ("two-hop", "bridge", "intermediate entity", "second hop"),
    "bridge3": ("three-hop", "third hop", "chain"),
    "comparison": ("comparison", "compare", "which came first", "earlier"),
    **{name: (name, hops) for name, (hops, _) in DATASETS.items()},
}

PATTERNS = {
    "single_hop": "single-hop question",
    "bridge": "two-hop bridge question",
    "bridge3": "three-hop bridge question",
    "comparison": "comparison question",
    "single-hop": "single-hop question",
    "multi-hop": "multi-hop question",
}


def pattern_of(kind: str) -> str:
    """The question pattern of a task kind (a generated kind, a dataset name, or its hop class)."""
    if kind in DATASETS:
        kind = DATASETS[kind][0]
    return PATTERNS.get(kind, "question")


_DESCRIPTIONS = {
    "single_hop": "single-hop question: search the named entity, answer with the fact its passage states",
    "bridge": "two-hop bridge question: search the named entity, then the entity its passage names, answer",
    "bridge3": "three-hop bridge question: follow three passages from the named entity, answer the last fact",
    "comparison": "comparison question: search both named entities, compare the stated values, name the winner",
}


def pattern_description(kind: str) -> str:
    """One line on how questions of this kind are solved (AIW's task descriptions)."""
    return _DESCRIPTIONS.get(kind, pattern_of(kind))


_ENTITY = re.compile(
    r"(?<!^)(?<![.?!] )\b(?:[A-Z][\w'-]*|\d{3,4})(?:\s+(?:of|at|in|the)?\s*(?:[A-Z][\w'-]*|\d+))*"
)


def abstract_question(question: str) -> str:
    """The question with its names and years replaced by X, lower-cased ("where was the author of X born?")."""
    text = _ENTITY.sub("X", " ".join(question.split()))
    return re.sub(r"\bx\b", "X", text.lower())


def is_multi_hop(kind: str) -> bool:
    return kind in MULTI_HOP_KINDS or (kind in DATASETS and DATASETS[kind][0] == "multi-hop")
