"""ALFWorld's deterministic failure analyser for AIW: it reads the trajectory itself.

Used when the policy is too small to analyse its own failures (the embedded default) and as the
labeller for failure-mode reports. Each rule looks for one pattern in the action/observation
sequence; rules are tried in ``RULE_ORDER`` (root causes before their symptoms: a skipped
precondition explains running out of steps, naming an object that is not there explains the refusals
that follow) and the first hit labels the episode. A command the environment refused is still a
command: only responses with no parsable action count as format errors, and those label the episode
first only when they dominate it (otherwise they are the fallback when no other rule matches). Lessons and queries are written from templates that name the task *pattern* ("clean then
place"), never the surface object, so retrieval generalises across objects.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from roleagent_jax.envs.alfworld.goals import APPLIANCE_OF_TRANSFORM, GoalSpec, parse_goal, pattern_name
from roleagent_jax.envs.rules import Hit, analyse_by_rules
from roleagent_jax.types import UNKNOWN, FailureReport, Trajectory

_GO = re.compile(r"^go to (.+)$")
_TAKE = re.compile(r"^take (.+?) from (.+)$")
_PUT = re.compile(r"^(?:move|put) (.+?) (?:to|in|on|into|in/on) (.+)$")
_XFORM = re.compile(r"^(clean|heat|cool) (.+?) with (.+)$")
_USE = re.compile(r"^use (.+)$")
_NOTHING = "nothing happens"
_LAMPS = ("desklamp", "floorlamp")
_ENTITY = re.compile(r"[a-z]+ \d+")
_ARGS = re.compile(r"^(?:go to|open|close|examine|use|slice) (.+)$")


def _kind(entity: str) -> str:
    """'apple 1' -> 'apple': entity names carry an instance number, the goal names only the kind."""
    return re.sub(r"\s*\d+$", "", entity.strip()).replace(" ", "")


@dataclass
class _Event:
    step: int  # 1-based
    action: str | None  # normalised command (admissible or not), None when the response had none
    obs: str
    failed: bool  # the environment refused it: inadmissible, or it answered "Nothing happens."


@dataclass
class _Facts:
    """What happened, pre-computed once for all rules."""

    events: list[_Event]
    goal: GoalSpec
    task_type: str
    max_steps: int
    won: bool
    env_failed: bool
    takes: list[tuple[int, str]]  # (step, entity) of successful takes
    puts: list[tuple[int, str, str]]  # (step, entity, receptacle) of successful puts
    xforms: list[tuple[int, str, str, str]]  # (step, verb, entity, appliance) of successful transforms
    uses: list[tuple[int, str, tuple[str, ...]]]  # (step, used entity, held entities) of successful uses
    gotos: list[tuple[int, str]]  # (step, target) of go-to actions
    known: set[str]  # entities ("apple 1") the trajectory's observations or admissible lists mention
    room_listed: bool  # some step recorded a non-empty admissible list


def _facts(traj: Trajectory, max_steps: int) -> _Facts:
    events, takes, puts, xforms, uses, gotos = [], [], [], [], [], []
    held: list[str] = []
    known: set[str] = set()
    for i, s in enumerate(traj.steps, 1):
        wrote = s.valid or s.parsed
        act = re.sub(r"\s+", " ", s.action).strip().lower() if (wrote and s.action) else None
        obs = s.next_observation or ""
        failed = obs.strip().lower().startswith(_NOTHING) or (act is not None and not s.valid)
        events.append(_Event(i, act, obs, failed))
        for text in (s.observation or "", obs, *(s.admissible or ())):
            known.update(_ENTITY.findall(text.lower()))
        if act is None:
            continue
        if m := _GO.match(act):
            gotos.append((i, m.group(1)))
        if failed:
            continue
        if m := _TAKE.match(act):
            takes.append((i, m.group(1)))
            held.append(m.group(1))
        elif m := _PUT.match(act):
            puts.append((i, m.group(1), m.group(2)))
            if m.group(1) in held:
                held.remove(m.group(1))
        elif m := _XFORM.match(act):
            xforms.append((i, m.group(1), m.group(2), m.group(3)))
        elif m := _USE.match(act):
            uses.append((i, m.group(1), tuple(held)))
    return _Facts(
        events, parse_goal(traj.goal, traj.task_type), traj.task_type, max_steps, traj.won, traj.env_failed,
        takes, puts, xforms, uses, gotos, known, any(s.admissible for s in traj.steps),
    )  # fmt: skip


def _format_error(f: _Facts, share: float = 0.5, run: int = 5) -> Hit | None:
    """No parsable action in at least `share` of the responses, or in `run` responses in a row."""
    bad = [e.step for e in f.events if e.action is None]
    if not bad:
        return None
    streak = best = 1
    best_start = start = bad[0]
    for a, b in zip(bad, bad[1:]):
        streak = streak + 1 if b == a + 1 else 1
        start = start if b == a + 1 else b
        if streak > best:
            best, best_start = streak, start
    if best >= run or len(bad) >= share * len(f.events):
        return best_start, f"{len(bad)} of {len(f.events)} responses had no parsable action"
    return None


def _some_format_error(f: _Facts) -> Hit | None:
    """The fallback: any unparsable response, when nothing else explains the failure."""
    return _format_error(f, share=0.0, run=1)


def _mostly_refused(f: _Facts) -> Hit | None:
    """The fallback for a policy that keeps writing commands the room does not take, all different."""
    refused = [e.step for e in f.events if e.action and e.failed]
    if refused and len(refused) >= 0.5 * len(f.events):
        return refused[0], f"{len(refused)} of {len(f.events)} commands had no effect"
    return None


def _arguments(action: str) -> list[str]:
    for pattern in (_TAKE, _PUT, _XFORM, _ARGS):
        if m := pattern.match(action):
            return [g.strip() for g in m.groups()]
    return []


def _absent_entity(f: _Facts) -> Hit | None:
    """A refused command naming an object or receptacle that nothing in the episode ever showed (only
    judged when the steps recorded their admissible commands, which list every receptacle of the room;
    the kinds the goal names count as present)."""
    if not f.room_listed:
        return None
    named = {f.goal.obj, f.goal.recep, f.goal.lamp} - {None}  # the task says these are in the room
    for e in f.events:
        if e.action and e.failed:
            args = [a for a in _arguments(e.action) if _ENTITY.fullmatch(a)]
            missing = [a for a in args if a not in f.known and _kind(a) not in named]
            if missing:
                return e.step, f"'{e.action}' names {missing[0]}, which nothing in the episode showed"
    return None


def _prepared(f: _Facts, entity: str, before: int) -> bool:
    verb = f.goal.transform
    return verb is None or any(v == verb and e == entity and s < before for s, v, e, _ in f.xforms)


def _missing_precondition(f: _Facts) -> Hit | None:
    g = f.goal
    if g.transform and g.obj and g.recep:
        for s, ent, rec in f.puts:
            if _kind(ent) == g.obj and _kind(rec) == g.recep and not _prepared(f, ent, s):
                return s, f"put {ent} in {rec} without doing '{g.transform}' first"
    if g.look and g.obj:
        for s, ent, held in f.uses:
            if _kind(ent) in _LAMPS and not any(_kind(h) == g.obj for h in held):
                return s, f"turned on {ent} without holding a {g.obj}"
    return None


def _entity_confusion(f: _Facts) -> Hit | None:
    if hit := _absent_entity(f):
        return hit
    g = f.goal
    if not g.obj:
        return None
    for s, ent in f.takes:
        if _kind(ent) == g.obj:
            continue
        used = [x for x in f.xforms if x[2] == ent and x[0] > s] + [
            p for p in f.puts if p[1] == ent and p[0] > s and g.recep and _kind(p[2]) == g.recep
        ]
        used += [u for u in f.uses if u[0] > s and ent in u[2]] if g.look else []
        if used:
            return s, f"took {ent} and used it as if it were the {g.obj}"
    if g.look and g.lamp:
        for s, ent, _ in f.uses:
            if _kind(ent) in _LAMPS and _kind(ent) != g.lamp:
                return s, f"used {ent} instead of a {g.lamp}"
    return None


def _wrong_receptacle(f: _Facts) -> Hit | None:
    """The goal object (prepared) put, or offered, to another kind of receptacle and never to the goal's."""
    g = f.goal
    if not (g.obj and g.recep):
        return None
    taken = {ent for _, ent in f.takes}
    tried = [
        (e.step, m.group(1), m.group(2))
        for e in f.events
        if e.action and e.failed and (m := _PUT.match(e.action)) and m.group(1) in taken
    ]
    for s, ent, rec in sorted(f.puts + tried):
        if _kind(ent) == g.obj and _kind(rec) != g.recep and _prepared(f, ent, s):
            later = any(p[1] == ent and _kind(p[2]) == g.recep for p in f.puts if p[0] > s)
            if not later:
                return s, f"put {ent} in {rec}, but the task wants it in a {g.recep}"
    return None


def _wrong_object_interaction(f: _Facts) -> Hit | None:
    need = f.goal.transform
    for s, verb, ent, app in f.xforms:
        if APPLIANCE_OF_TRANSFORM[verb] != _kind(app):
            return s, f"tried to {verb} {ent} with {app}"
        if need is not None and verb != need:
            return s, f"did '{verb}' but the task needs '{need}'"
    for e in f.events:
        if e.action and e.failed and (m := _USE.match(e.action)) and _kind(m.group(1)) not in _LAMPS:
            return e.step, f"tried to use {m.group(1)}, which cannot be used"
        if e.action and e.failed and (m := _XFORM.match(e.action)):
            verb, ent, app = m.groups()
            if APPLIANCE_OF_TRANSFORM[verb] != _kind(app) or (need is not None and verb != need):
                return e.step, f"tried to {verb} {ent} with {app}"
    return None


def _repeated_failed_action(f: _Facts) -> Hit | None:
    counts = Counter(e.action for e in f.events if e.action and e.failed)
    for e in f.events:
        if e.action and e.failed and counts[e.action] >= 3:
            return e.step, f"'{e.action}' had no effect {counts[e.action]} times"
    return None


def _navigation_loop(f: _Facts, window: int = 6) -> Hit | None:
    targets = [t for _, t in f.gotos]
    for i in range(len(targets) - window + 1):
        if len(set(targets[i : i + window])) <= 2:
            places = " and ".join(sorted(set(targets[i : i + window])))
            return f.gotos[i][0], f"went back and forth between {places}"
    return None


def _repetitive_exploration(f: _Facts) -> Hit | None:
    run = 1
    for a, b in zip(f.events, f.events[1:]):
        run = run + 1 if (b.action and b.action == a.action and not b.failed) else 1
        if run >= 3:
            return b.step - 2, f"repeated '{b.action}' {run} times in a row"
    seen: set[str] = set()
    revisits = []
    for s, t in f.gotos:
        if t in seen:
            revisits.append(s)
        seen.add(t)
    if len(revisits) >= max(4, 0.4 * len(f.gotos)):
        return revisits[0], f"{len(revisits)} of {len(f.gotos)} moves went to places already searched"
    return None


def _premature_give_up(f: _Facts) -> Hit | None:
    if f.won or f.env_failed or not f.events or len(f.events) >= f.max_steps:
        return None
    return len(f.events), f"stopped after {len(f.events)} of {f.max_steps} steps"


def _held_goal_object(f: _Facts) -> int | None:
    return next((s for s, ent in f.takes if f.goal.obj and _kind(ent) == f.goal.obj), None)


def _exhaustive_exploration(f: _Facts) -> Hit | None:
    """Many places searched, yet fewer goal objects taken than the task needs (two for pick-two tasks)."""
    places = {t for _, t in f.gotos}
    if not f.goal.obj or len(places) < 6:
        return None
    got = {ent for _, ent in f.takes if _kind(ent) == f.goal.obj}
    if len(got) < f.goal.count:
        what = f"a {f.goal.obj}" if f.goal.count == 1 else f"{f.goal.count} different {f.goal.obj}s"
        return len(f.events), f"searched {len(places)} places and never took {what}"
    return None


def _wrong_target_location(f: _Facts) -> Hit | None:
    g = f.goal
    s = _held_goal_object(f)
    if s is None or not g.recep:
        return None
    reached = any(_kind(t) == g.recep for st, t in f.gotos if st > s)
    if not reached:
        return s, f"took the {g.obj} but never went to a {g.recep}"
    return None


RULES: dict[str, Callable[[_Facts], Hit | None]] = {
    "action_format_error": _format_error,
    "missing_precondition": _missing_precondition,
    "entity_confusion": _entity_confusion,
    "wrong_receptacle": _wrong_receptacle,
    "wrong_object_interaction": _wrong_object_interaction,
    "repeated_failed_action": _repeated_failed_action,
    "navigation_loop": _navigation_loop,
    "repetitive_exploration": _repetitive_exploration,
    "premature_give_up": _premature_give_up,
    "wrong_target_location": _wrong_target_location,
    "exhaustive_exploration_failure": _exhaustive_exploration,
}
_BEFORE_GIVE_UP = list(RULES).index("premature_give_up")
# (type, rule) in the order they are tried: a dominant format error first; mostly refused commands
# explain stopping early; a stray unparsable answer is the last resort
RULE_SEQUENCE: tuple[tuple[str, Callable[[_Facts], Hit | None]], ...] = (
    *list(RULES.items())[:_BEFORE_GIVE_UP],
    ("repeated_failed_action", _mostly_refused),
    *list(RULES.items())[_BEFORE_GIVE_UP:],
    ("action_format_error", _some_format_error),
)
RULE_ORDER = tuple(RULES)

# type -> (lesson, query) templates; {p} pattern name, {prep} what must come first, {verb} its short name
_TEMPLATES: dict[str, tuple[str, str]] = {
    "action_format_error": (
        "In {p} tasks, always answer with exactly one admissible command inside the action tags.",
        "{p}: invalid action format",
    ),
    "missing_precondition": (
        "In {p} tasks, {prep} before finishing; placing it too early does not count.",
        "{p}: skipped the {verb} step before finishing",
    ),
    "entity_confusion": (
        "In {p} tasks, check that the object you take is exactly the kind the task names.",
        "{p}: took the wrong kind of object",
    ),
    "wrong_receptacle": (
        "In {p} tasks, move the object to the receptacle the task names, not a nearby one.",
        "{p}: placed in the wrong receptacle",
    ),
    "wrong_object_interaction": (
        "In {p} tasks, use the right appliance for the step: sinkbasin to clean, microwave to heat, fridge to cool.",
        "{p}: wrong appliance or inapplicable action",
    ),
    "repeated_failed_action": (
        "In {p} tasks, when an action has no effect, change it instead of repeating it.",
        "{p}: repeated an action that had no effect",
    ),
    "navigation_loop": (
        "In {p} tasks, do not walk back and forth; visit receptacles you have not searched yet.",
        "{p}: navigation loop between the same places",
    ),
    "repetitive_exploration": (
        "In {p} tasks, remember which places were searched and move on to new ones.",
        "{p}: searched the same places again",
    ),
    "premature_give_up": (
        "In {p} tasks, keep acting until the object is in place; the episode does not end early by itself.",
        "{p}: gave up early",
    ),
    "wrong_target_location": (
        "In {p} tasks, once you hold the object go straight to the target receptacle.",
        "{p}: held the object but never reached the target",
    ),
    "exhaustive_exploration_failure": (
        "In {p} tasks, search likely places for the object first and open closed receptacles.",
        "{p}: searched everywhere without finding the object",
    ),
    UNKNOWN: ("In {p} tasks, plan the steps the task needs before acting.", "{p}: failed"),
}
_PREP = {
    "clean": "clean the object with the sinkbasin",
    "heat": "heat the object with the microwave",
    "cool": "cool the object with the fridge",
}


def analyse(traj: Trajectory, max_steps: int = 50) -> FailureReport:
    """Label a failed trajectory with the first matching rule of ``RULE_SEQUENCE`` (``unknown`` if none)."""
    f = _facts(traj, max_steps)
    fields = {
        "p": pattern_name(traj.task_type),
        "prep": _PREP.get(f.goal.transform or "", "hold the object before turning on the lamp"),
        "verb": f.goal.transform or "lamp",
    }
    return analyse_by_rules(RULE_SEQUENCE, f, _TEMPLATES, fields, won=traj.won, env_failed=traj.env_failed)
