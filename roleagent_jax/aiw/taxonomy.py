"""The structured failure report and the mapping of free-form type answers onto a family's taxonomy.

A family lists its failure types (`Family.failure_types`, with glosses) and the phrases small models use
for them (`Family.failure_keywords`); `unknown` is added here for answers that fit none.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rapidfuzz import fuzz, process

if TYPE_CHECKING:
    from roleagent_jax.envs.base import Family

UNKNOWN = "unknown"

_NON_WORD = re.compile(r"[^a-z0-9]+")
FUZZY_THRESHOLD = 85.0


def taxonomy(family: Family) -> tuple[str, ...]:
    """The family's failure type names in its order, then ``unknown``."""
    if not family.failure_types:
        raise ValueError(f"environment {family.name!r} lists no failure types (Family.failure_types)")
    return (*family.failure_types, UNKNOWN)


def _slug(text: str) -> str:
    return _NON_WORD.sub("_", text.lower()).strip("_")


def normalize_failure_type(text: str, family: Family) -> str:
    """Map a free-form type answer onto the family's taxonomy; ``unknown`` when nothing fits well enough.

    Order: exact name; a name contained in the answer; rapidfuzz match of the answer's first clause
    against the names (token-sort ratio >= FUZZY_THRESHOLD, catches typos like ``navigaton loop``);
    the family's keyword phrases.
    """
    names = taxonomy(family)
    slug = _slug(text or "")[:300]
    if not slug:
        return UNKNOWN
    if slug in names:
        return slug
    found = [(slug.find(n), n) for n in names if n != UNKNOWN and n in slug]
    if found:
        return min(found)[1]
    head = _slug(re.split(r"[(,;:.\n]| - ", text, maxsplit=1)[0])
    spaced = [n.replace("_", " ") for n in names if n != UNKNOWN]
    for cand in dict.fromkeys((head, slug)):
        if cand:
            hit = process.extractOne(cand.replace("_", " "), spaced, scorer=fuzz.token_sort_ratio)
            if hit and hit[1] >= FUZZY_THRESHOLD:
                return hit[0].replace(" ", "_")
    for key, name in family.failure_keywords:
        if key in slug and name in names:
            return name
    return UNKNOWN


@dataclass
class FailureReport:
    """One analysed failure. ``critical_step`` is 1-based, as steps are numbered in the analysis prompt."""

    failure_type: str = UNKNOWN
    detail: str = ""
    critical_step: int | None = None
    lesson: str = ""
    query: str = ""
    raw: str = ""
    source: str = "llm"  # "llm" | "heuristic"

    @property
    def usable(self) -> bool:
        """True when the report says something retrieval can use (a known type, a query or a lesson)."""
        return self.failure_type != UNKNOWN or bool(self.query.strip()) or bool(self.lesson.strip())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FailureReport:
        keys = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in keys})
