"""The expert of generated questions: look up each hop's entity, read the fact, answer.

It knows the question's plan (which entity to start from and which relations to follow) but nothing
of the answers: every value comes out of passages the retriever actually returned, read with the
knowledge base's fact patterns. So its exact match measures whether the corpus and the retriever
support the questions. A hop whose passage did not come back is searched once more with the relation
in the query; with one turn left it answers with what it has.
"""

from __future__ import annotations

from collections.abc import Sequence

from roleagent_jax.envs.search_qa.corpus import parse_information
from roleagent_jax.envs.search_qa.kb import read_fact
from roleagent_jax.envs.search_qa.parser import SEARCH, parse_turn

_HINT = {
    "capital": "capital",
    "country": "city",
    "founded": "founded",
    "birthplace": "born",
    "birth_year": "born",
    "creator": "by",
    "year": "year",
}


def _seen(observations: Sequence[str]) -> dict[str, str]:
    """Title (lower case) -> text of every passage in the observations, first occurrence kept."""
    seen: dict[str, str] = {}
    for obs in observations:
        for p in parse_information(obs):
            seen.setdefault(p.title.lower(), p.text)
    return seen


def _next_step(plan: tuple, seen: dict[str, str]) -> tuple[str | None, str | None, str]:
    """(entity still to look up, its relation, best answer so far); entity None when solved."""
    if plan[0] == "chain":
        current = plan[1]
        for rel in plan[2:]:
            text = seen.get(current.lower())
            value = read_fact(text, rel) if text is not None else None
            if value is None:
                return current, rel, current
            current = value
        return None, None, current
    _, rel, pick, a, b = plan
    values = {}
    for e in (a, b):
        text = seen.get(e.lower())
        value = read_fact(text, rel) if text is not None else None
        if value is None or not value.isdigit():
            return e, rel, a
        values[e] = int(value)
    better = min if pick == "min" else max
    return None, None, better((a, b), key=lambda e: values[e])


def expert_response(plan: tuple, observations: Sequence[str], actions: Sequence[str], turns_left: int) -> str:
    """The expert's next response given everything it saw and did so far in this episode."""
    if not plan:
        raise ValueError("the expert needs a question plan (only generated questions have one)")
    entity, rel, best = _next_step(plan, _seen(observations))
    if entity is None or turns_left <= 1:
        return f"<answer>{best}</answer>"
    searched = {t.content.lower() for t in map(parse_turn, actions) if t.kind == SEARCH}
    query = entity if entity.lower() not in searched else f"{entity} {_HINT[rel]}"
    if query.lower() in searched:
        return f"<answer>{best}</answer>"
    return f"<search>{query}</search>"
