"""The mapping of free-form type answers onto a family's taxonomy.

A family lists its failure types (`Family.failure_types`, with glosses) and the phrases small models use
for them (`Family.failure_keywords`); `unknown` is added here for answers that fit none. The failure
record itself (`FailureReport`, `UNKNOWN`) lives in `roleagent_jax.types`, below the families.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rapidfuzz import fuzz, process

from roleagent_jax.types import UNKNOWN, FailureReport

if TYPE_CHECKING:
    from roleagent_jax.envs.base import Family

__all__ = ["FUZZY_THRESHOLD", "UNKNOWN", "FailureReport", "normalize_failure_type", "taxonomy"]

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
