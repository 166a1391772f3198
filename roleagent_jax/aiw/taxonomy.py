"""Failure taxonomy and the structured failure report shared by the LLM parser and the heuristic."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from rapidfuzz import fuzz, process

UNKNOWN = "unknown"

# Short glosses in our own words; they go into the analysis prompt so the model knows what each name means.
ALFWORLD_TYPES: dict[str, str] = {
    "repetitive_exploration": "re-searched places or repeated looks that were already done",
    "wrong_target_location": "had the right object but never brought it to the goal place",
    "wrong_receptacle": "put the object into a different receptacle than the goal's",
    "premature_give_up": "stopped acting before the task was finished",
    "missing_precondition": "skipped a required step (clean/heat/cool, holding the object) before finishing",
    "repeated_failed_action": "repeated an action that had no effect",
    "navigation_loop": "walked back and forth between the same few places",
    "entity_confusion": "handled a different object than the one the task names",
    "wrong_object_interaction": "used the wrong appliance or an action that does not apply to the object",
    "exhaustive_exploration_failure": "searched many places and never got the needed object",
    "action_format_error": "answers without a valid action in the required format",
}

TAXONOMY: dict[str, tuple[str, ...]] = {"alfworld": (*ALFWORLD_TYPES, UNKNOWN)}
DESCRIPTIONS: dict[str, dict[str, str]] = {"alfworld": ALFWORLD_TYPES}

# Phrases small models use for a type instead of its name (checked after exact and fuzzy matching).
_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("format", "action_format_error"),
    ("invalid_action", "action_format_error"),
    ("precondition", "missing_precondition"),
    ("prerequisite", "missing_precondition"),
    ("skipped_step", "missing_precondition"),
    ("give_up", "premature_give_up"),
    ("gave_up", "premature_give_up"),
    ("giving_up", "premature_give_up"),
    ("premature", "premature_give_up"),
    ("loop", "navigation_loop"),
    ("back_and_forth", "navigation_loop"),
    ("confus", "entity_confusion"),
    ("wrong_object", "entity_confusion"),
    ("exhaust", "exhaustive_exploration_failure"),
    ("never_found", "exhaustive_exploration_failure"),
    ("repeated_fail", "repeated_failed_action"),
    ("failed_action", "repeated_failed_action"),
    ("repetit", "repetitive_exploration"),
    ("redundant", "repetitive_exploration"),
    ("receptacle", "wrong_receptacle"),
    ("wrong_location", "wrong_target_location"),
    ("target_location", "wrong_target_location"),
    ("wrong_tool", "wrong_object_interaction"),
    ("interaction", "wrong_object_interaction"),
)

_NON_WORD = re.compile(r"[^a-z0-9]+")
FUZZY_THRESHOLD = 85.0


def taxonomy(env: str) -> tuple[str, ...]:
    if env not in TAXONOMY:
        raise ValueError(f"no failure taxonomy for environment {env!r}; known: {sorted(TAXONOMY)}")
    return TAXONOMY[env]


def _slug(text: str) -> str:
    return _NON_WORD.sub("_", text.lower()).strip("_")


def normalize_failure_type(text: str, env: str = "alfworld") -> str:
    """Map a free-form type answer onto the taxonomy; ``unknown`` when nothing fits well enough.

    Order: exact name; a name contained in the answer; rapidfuzz match of the answer's first clause
    against the names (token-sort ratio >= FUZZY_THRESHOLD, catches typos like ``navigaton loop``);
    keyword phrases.
    """
    names = taxonomy(env)
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
    for key, name in _KEYWORDS:
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
