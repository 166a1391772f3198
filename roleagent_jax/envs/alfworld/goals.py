"""ALFWorld's task patterns: what a task asks for, abstracted from the surface objects.

AIW's retrieval works at this level ("clean then place"), so a failure on a clean-apple task pulls other
clean-then-place tasks whatever their object. Goals are parsed from ALFWorld's own sentence templates;
the heuristic analyser reads the parsed goal too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# task type -> (short pattern name, one-line description)
TASK_PATTERNS: dict[str, tuple[str, str]] = {
    "pick_and_place_simple": (
        "pick and place",
        "pick and place: find the object, take it, move it to the target receptacle",
    ),
    "look_at_obj_in_light": (
        "look in light",
        "look in light: find the object, hold it, turn on the desklamp to examine it",
    ),
    "pick_clean_then_place_in_recep": (
        "clean then place",
        "clean then place: take the object, clean it with the sinkbasin, then move it to the receptacle",
    ),
    "pick_heat_then_place_in_recep": (
        "heat then place",
        "heat then place: take the object, heat it with the microwave, then move it to the receptacle",
    ),
    "pick_cool_then_place_in_recep": (
        "cool then place",
        "cool then place: take the object, cool it with the fridge, then move it to the receptacle",
    ),
    "pick_two_obj_and_place": (
        "two objects place",
        "two objects place: find two objects of the kind, move both to the receptacle",
    ),
}

# distinctive words per task type for fuzzy retrieval; multi-word keys are matched as phrases
PATTERN_KEYWORDS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("pick and place", "simple place"),
    "look_at_obj_in_light": ("look", "lamp", "desklamp", "light", "examine"),
    "pick_clean_then_place_in_recep": ("clean", "sink", "sinkbasin", "wash", "rinse"),
    "pick_heat_then_place_in_recep": ("heat", "hot", "microwave", "warm"),
    "pick_cool_then_place_in_recep": ("cool", "cold", "fridge", "chill"),
    "pick_two_obj_and_place": ("two", "both", "pair", "second"),
}

TRANSFORM_OF_TYPE = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}
APPLIANCE_OF_TRANSFORM = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}


def pattern_name(task_type: str) -> str:
    """Short pattern name ("clean then place"); unknown types fall back to their words."""
    if task_type in TASK_PATTERNS:
        return TASK_PATTERNS[task_type][0]
    return task_type.replace("_", " ").strip() or "task"


def pattern_text(task_type: str) -> str:
    if task_type in TASK_PATTERNS:
        return TASK_PATTERNS[task_type][1]
    return pattern_name(task_type)


@dataclass(frozen=True)
class GoalSpec:
    """The parts of a goal the heuristic needs; fields are None when the sentence did not say."""

    obj: str | None = None  # object kind, e.g. "apple"
    recep: str | None = None  # target receptacle kind, e.g. "fridge"
    transform: str | None = None  # "clean" | "heat" | "cool"
    look: bool = False
    lamp: str | None = None
    count: int = 1


_W = r"([a-z]+)"
_ART = r"(?:a |an |some |the )?"
_GOAL_PATTERNS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(rf"^(?:look at|examine) {_ART}{_W} (?:under|with) (?:the |a )?{_W}"), "look"),
    (re.compile(rf"^(?:put|find) two {_W}(?: and put them)? (?:in|on|into) {_ART}{_W}"), "two"),
    (re.compile(rf"^(clean|heat|cool) {_ART}{_W} and put it (?:in|on|into) {_ART}{_W}"), "verb"),
    (re.compile(rf"^put {_ART}(clean|hot|cool|cold|heated|cooled) {_W} (?:in|on|into) {_ART}{_W}"), "adj"),
    (re.compile(rf"^put {_ART}{_W} (?:in|on|into) {_ART}{_W}"), "simple"),
)
_ADJ = {"clean": "clean", "hot": "heat", "heated": "heat", "cool": "cool", "cold": "cool", "cooled": "cool"}


def parse_goal(goal: str, task_type: str | None = None) -> GoalSpec:
    """Parse an ALFWorld goal sentence ("put a clean apple in fridge."); never raises."""
    text = re.sub(r"^.*your task is to:\s*", "", (goal or "").lower().strip(), flags=re.DOTALL)
    text = re.sub(r"\s+", " ", text).strip().rstrip(".")
    transform = TRANSFORM_OF_TYPE.get(task_type or "")
    for pat, kind in _GOAL_PATTERNS:
        m = pat.match(text)
        if not m:
            continue
        g = m.groups()
        if kind == "look":
            return GoalSpec(obj=g[0], look=True, lamp=g[1])
        if kind == "two":
            return GoalSpec(obj=g[0], recep=g[1], count=2)
        if kind == "verb":
            return GoalSpec(obj=g[1], recep=g[2], transform=g[0])
        if kind == "adj":
            return GoalSpec(obj=g[1], recep=g[2], transform=_ADJ[g[0]])
        return GoalSpec(obj=g[0], recep=g[1], transform=transform)
    return GoalSpec(transform=transform, look=task_type == "look_at_obj_in_light")


def abstract_goal(goal: str, task_type: str | None = None) -> str:
    """The goal with its object and receptacle replaced by placeholders ("put a clean X in Y")."""
    spec = parse_goal(goal, task_type)
    text = re.sub(r"^.*your task is to:\s*", "", (goal or "").lower().strip(), flags=re.DOTALL)
    for word, tag in ((spec.obj, "X"), (spec.recep, "Y"), (spec.lamp, "LAMP")):
        if word:
            text = re.sub(rf"\b{re.escape(word)}\b", tag, text)
    return text.strip()
