"""Questions over the generated knowledge base: single-hop, 2- and 3-hop bridges, comparisons.

Every question names entities of the knowledge base only, and its answer is stated only in the corpus.
Each carries a `plan`, the hops that solve it: ("chain", start entity, relations...) follows relations
from the start entity (each value is the next entity to look up), ("compare", relation, pick, a, b)
looks up one relation of two entities and names the one with the smaller ("min") or larger ("max")
value.

Splits, held out by "entities" (the default): the entities named in questions are partitioned once
per knowledge base (a quarter held out, chosen by the knowledge base's seed, so every question seed
sees the same partition); a train question names only train entities and a held-out question only
held-out ones, so held-out answers were never the answer of a training question about the same
entity. Intermediate entities (a creator's birthplace, say) are shared; they are looked up, never
named. Held out by "questions": a quarter of the questions themselves (by a hash of their plan), over
all entities; a held-out question is new, its entities are not (a tiny model then learns a closed set
of names instead of copying unseen ones).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from roleagent_jax.envs.search_qa.kb import WORK_KINDS, KnowledgeBase, fact
from roleagent_jax.envs.search_qa.tasks import QATask

KINDS = ("single_hop", "bridge", "bridge3", "comparison")
MULTI_HOP_KINDS = frozenset({"bridge", "bridge3", "comparison"})
DEFAULT_MIX = {"single_hop": 0.35, "bridge": 0.3, "bridge3": 0.2, "comparison": 0.15}
SPLITS = ("train", "test")
HELD_OUT = 0.25
HOLD_OUT_BY = ("entities", "questions", "worlds")  # worlds: held-out questions ask other knowledge bases
SOURCE = "generated"

# (start type, relations) -> question template; {e} is the start entity, {role}/{made}/{dated} its work's
_CHAINS: dict[tuple[str, tuple[str, ...]], str] = {
    ("person", ("birthplace",)): "Where was {e} born?",
    ("person", ("birth_year",)): "In what year was {e} born?",
    ("work", ("creator",)): "Who {made_active} {e}?",
    ("work", ("year",)): "In what year was {e} {dated}?",
    ("city", ("country",)): "In which country is {e}?",
    ("city", ("founded",)): "In what year was {e} founded?",
    ("country", ("capital",)): "What is the capital of {e}?",
    ("work", ("creator", "birthplace")): "Where was the {role} of {e} born?",
    ("work", ("creator", "birth_year")): "In what year was the {role} of {e} born?",
    ("person", ("birthplace", "country")): "In which country was {e} born?",
    ("person", ("birthplace", "founded")): "In what year was the birthplace of {e} founded?",
    ("country", ("capital", "founded")): "In what year was the capital of {e} founded?",
    ("work", ("creator", "birthplace", "country")): "In which country was the {role} of {e} born?",
    ("work", ("creator", "birthplace", "founded")): "In what year was the birthplace of the {role} of {e} founded?",
}  # fmt: skip
_ACTIVE = {"written": "wrote", "composed": "composed", "directed": "directed", "painted": "painted"}
# (entity type, relation, pick) -> comparison template
_COMPARISONS: dict[tuple[str, str, str], str] = {
    ("person", "birth_year", "min"): "Who was born first, {a} or {b}?",
    ("person", "birth_year", "max"): "Who was born later, {a} or {b}?",
    ("work", "year", "min"): "Which work is older, {a} or {b}?",
    ("city", "founded", "min"): "Which city was founded first, {a} or {b}?",
}


def _table(kb: KnowledgeBase, kind: str) -> dict:
    return {"country": kb.countries, "city": kb.cities, "person": kb.people, "work": kb.works}[kind]


def held_out_entities(kb: KnowledgeBase) -> set[str]:
    """The entities only held-out questions may name (a quarter of each type, at least one)."""
    rng = random.Random(f"split:{kb.seed}")
    out: set[str] = set()
    for kind in ("country", "city", "person", "work"):
        names = sorted(_table(kb, kind))
        rng.shuffle(names)
        out.update(names[: max(1, round(HELD_OUT * len(names)))])
    return out


def _words(kb: KnowledgeBase, entity: str) -> dict[str, str]:
    if entity in kb.works:
        _, made, dated, role = WORK_KINDS[kb.works[entity].kind]
        return {"role": role, "made_active": _ACTIVE[made], "dated": dated}
    return {}


def answer_of(kb: KnowledgeBase, plan: tuple) -> str:
    """The answer a plan leads to, computed from the records."""
    if plan[0] == "chain":
        value = plan[1]
        for rel in plan[2:]:
            value = fact(kb, value, rel)
        return value
    _, rel, pick, a, b = plan
    va, vb = int(fact(kb, a, rel)), int(fact(kb, b, rel))
    return a if (va < vb) == (pick == "min") else b


def _candidates(
    kb: KnowledgeBase, allowed: Callable[[str], bool], kind: str, rng: random.Random
) -> list[tuple]:
    """Every (question, plan) of one kind whose named entities pass `allowed` (comparisons: sampled pairs)."""
    out = []
    if kind != "comparison":
        hops = {"single_hop": 1, "bridge": 2, "bridge3": 3}[kind]
        for (start, rels), template in _CHAINS.items():
            if len(rels) != hops:
                continue
            for e in sorted(_table(kb, start)):
                if allowed(e):
                    out.append((template.format(e=e, **_words(kb, e)), ("chain", e, *rels)))
        return out
    for (etype, rel, pick), template in _COMPARISONS.items():
        names = sorted(n for n in _table(kb, etype) if allowed(n))
        pairs = set()
        for _ in range(4 * len(names)):
            a, b = rng.sample(names, 2)
            if fact(kb, a, rel) != fact(kb, b, rel) and (a, b) not in pairs and (b, a) not in pairs:
                pairs.add((a, b))
        for a, b in sorted(pairs):
            out.append((template.format(a=a, b=b), ("compare", rel, pick, a, b)))
    return out


def generate_questions(
    kb: KnowledgeBase,
    n: int,
    split: str,
    seed: int = 0,
    mix: dict[str, float] | None = None,
    held_out: str = "entities",
) -> list[QATask]:
    """n distinct questions of one split, mixed by kind (`mix` weights, default DEFAULT_MIX), drawn with
    `seed` (the knowledge base's own seed fixes what is held out: `held_out` entities or questions;
    with "worlds" every question of this knowledge base may be asked, the held-out ones being asked of
    other knowledge bases).

    Comparisons alternate which option is the answer, so naming an option blindly is right half the time.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    if set(mix) - set(KINDS) or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"question mix must weigh kinds among {KINDS} with weights >= 0, got {mix}")
    if n < 1:
        raise ValueError(f"number of questions must be >= 1, got {n}")
    if held_out not in HOLD_OUT_BY:
        raise ValueError(f"held_out must be one of {HOLD_OUT_BY}, got {held_out!r}")
    if held_out == "entities":
        held = held_out_entities(kb)
        allowed = (lambda e: e in held) if split == "test" else (lambda e: e not in held)
    else:
        allowed = lambda e: True  # noqa: E731
    rng = random.Random(f"questions:{seed}:{split}")
    total = sum(mix.values())
    counts = {k: int(n * w / total) for k, w in mix.items()}
    for k in sorted(mix, key=lambda k: -(n * mix[k] / total - counts[k]))[: n - sum(counts.values())]:
        counts[k] += 1
    picked: list[tuple[str, tuple, str]] = []
    for kind in KINDS:
        if not counts.get(kind):
            continue
        pool = _candidates(kb, allowed, kind, rng)
        if held_out == "questions":
            pool = [(q, plan) for q, plan in pool if _held_out_question(kb, plan) == (split == "test")]
        if len(pool) < counts[kind]:
            raise ValueError(
                f"the knowledge base has only {len(pool)} {split} questions of kind {kind!r}, "
                f"{counts[kind]} asked; use a larger knowledge base or fewer questions"
            )
        chosen = rng.sample(pool, counts[kind])
        if kind == "comparison":
            chosen = [_balanced(kb, q, plan, i) for i, (q, plan) in enumerate(chosen)]
        picked += [(q, plan, kind) for q, plan in chosen]
    rng.shuffle(picked)
    return [
        QATask(q, (answer_of(kb, plan),), SOURCE, kind, f"gen_{split}_{seed}_{i}", plan)
        for i, (q, plan, kind) in enumerate(picked)
    ]


def _held_out_question(kb: KnowledgeBase, plan: tuple) -> bool:
    """Whether a question is held out (a quarter, by a hash of its plan; a comparison's option order
    does not matter)."""
    key = repr((plan[0], plan[1], plan[2], *sorted(plan[3:]))) if plan[0] == "compare" else repr(plan)
    digest = hashlib.blake2b(f"{kb.seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < HELD_OUT


def _balanced(kb: KnowledgeBase, question: str, plan: tuple, i: int) -> tuple[str, tuple]:
    """Swap the two options so that the answer is named first exactly when i is even."""
    _, rel, pick, a, b = plan
    first_wins = answer_of(kb, plan) == a
    if first_wins == (i % 2 == 0):
        return question, plan
    template = _COMPARISONS[(kb.entity_type(a), rel, pick)]
    return template.format(a=b, b=a), ("compare", rel, pick, b, a)
