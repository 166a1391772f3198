"""The analysis prompt (the policy as failure analyst) and a defensive parser of its answer."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from roleagent_jax.aiw.taxonomy import normalize_failure_type, taxonomy
from roleagent_jax.envs.text import clip_text
from roleagent_jax.types import UNKNOWN, FailureReport, Trajectory

if TYPE_CHECKING:
    from roleagent_jax.envs.base import Family

ANALYSIS_STOP = "</analysis>"

MAX_INPUT_CHARS = 20000  # longer answers are cut before parsing (bounded work on runaway generations)
MAX_RAW_CHARS = 4000
MAX_FIELD_CHARS = 400


def build_analysis_prompt(
    traj: Trajectory,
    family: Family,
    max_steps_shown: int = 12,
    *,
    obs_chars: int = 120,
    describe_types: bool = True,
) -> str:
    """Ask the policy why ``traj`` failed, in five fixed lines that ``parse_failure_report`` reads.

    Steps are numbered from 1. Long episodes show their first two steps and the last
    ``max_steps_shown - 2`` with a marker for the omitted middle, because failures usually become
    irreversible late and the opening sets the context.
    """
    names = [n for n in taxonomy(family) if n != UNKNOWN]
    steps = list(enumerate(traj.steps, 1))
    if len(steps) > max_steps_shown:
        head = max(0, min(2, max_steps_shown - 1))
        shown = steps[:head] + [None] + steps[len(steps) - (max_steps_shown - head) :]
    else:
        shown = steps
    outcome = "environment error" if traj.env_failed else f"failed after {len(traj.steps)} steps"
    lines = [
        family.analysis_intro,
        f"Task: {clip_text(traj.goal, 160)} (type: {traj.task_type})",
        f"Outcome: {outcome}",
    ]
    for item in shown:
        if item is None:
            lines.append("... (steps omitted) ...")
            continue
        i, s = item
        if s.action and (s.valid or s.parsed):
            act = s.action if s.valid else f"REFUSED: {s.action}"  # a command, just not an admissible one
        else:
            act = f"INVALID: {clip_text(s.response or '', 60)}"
        lines.append(f"{i}. {clip_text(act, 80)} -> {clip_text(s.next_observation or '', obs_chars)}")
    if describe_types:
        lines.append("Failure types:")
        lines.extend(f"- {n}: {family.failure_types[n]}" for n in names)
    else:
        lines.append("Failure types: " + ", ".join(names))
    lines += [
        "Answer with exactly these lines, then " + ANALYSIS_STOP,
        "FAILURE_TYPE: <one type name from the list>",
        "DETAIL: <what went wrong, one sentence>",
        "CRITICAL_STEP: <number of the step where it went wrong>",
        "LESSON: <advice that holds for every task of this kind, not just this object>",
        "QUERY: <a short phrase naming the task pattern and the mistake, to find similar tasks>",
    ]
    return "\n".join(lines) + "\n"


# canonical field -> accepted spellings (after upper-casing and turning spaces/dashes into "_")
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "failure_type": (
        "FAILURE_TYPE", "ROOT_CAUSE_TYPE", "DOMINANT_TYPE", "TYPE", "FAILURE", "ROOT_CAUSE", "FAILURE_MODE",
        "CATEGORY", "ERROR_TYPE", "FAILURE_CATEGORY", "TYPE_OF_FAILURE", "MAIN_FAILURE_TYPE",
    ),
    "detail": (
        "DETAIL", "DETAILS", "ROOT_CAUSE_DETAIL", "FAILURE_DETAIL", "EXPLANATION", "REASON", "DESCRIPTION",
        "ANALYSIS", "CAUSE", "WHAT_WENT_WRONG",
    ),
    "critical_step": (
        "CRITICAL_STEP", "KEY_STEP", "STEP", "TURNING_POINT", "CRITICAL_TURN", "CRITICAL_MOMENT",
        "FAILURE_STEP", "CRITICAL_STEP_NUMBER",
    ),
    "lesson": (
        "LESSON", "LESSONS", "CORE_LESSON", "TRANSFERABLE_LESSON", "KEY_LESSON", "TAKEAWAY", "LESSON_LEARNED",
        "LESSONS_LEARNED", "ADVICE",
    ),
    "query": ("QUERY", "RETRIEVAL_QUERY", "SEARCH_QUERY", "RETRIEVAL", "RETRIEVAL_KEY", "SIMILAR_TASKS_QUERY"),
}  # fmt: skip
_KEY_TO_FIELD = {syn: f for f, syns in _SYNONYMS.items() for syn in syns}

# Split "FAILURE_TYPE: x DETAIL: y" written on one line: multi-word keys in any case, one-word keys in caps.
_MULTI = sorted((k for k in _KEY_TO_FIELD if "_" in k), key=len, reverse=True)
_SINGLE = sorted(k for k in _KEY_TO_FIELD if "_" not in k)
_INLINE_KEY = re.compile(
    r"(?<![A-Za-z_])((?i:" + "|".join(k.replace("_", "[ _-]") for k in _MULTI) + r")|(?:"
    + "|".join(_SINGLE) + r"))(?=[*_`\"' ]*[:：=])"
)  # fmt: skip
_QUOTED_KEY = re.compile(r"[\"']([A-Za-z][A-Za-z _-]{1,40})[\"']\s*(?=[:：=])")
_SEP = re.compile(r"[:：=]")
_MD = "*_`#>\"'“”‘’[]{}()| \t"
_PLACEHOLDER = re.compile(r"^<[^>]*>$|^\.\.\.$|^n/?a$|^none$", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _field_of(key: str) -> str | None:
    k = re.sub(r"^[\s\-*+•>#\d.)]+", "", key)  # bullets, heading marks, "1." numbering
    if re.search(r"\d", k):  # "Step 3: go to desk 1" is an echoed trajectory line, not a field
        return None
    k = re.sub(r"[^A-Za-z _\-]", "", k).strip()
    k = re.sub(r"[\s\-]+", "_", k).upper()
    return _KEY_TO_FIELD.get(k)


def _clean_value(v: str) -> str:
    v = v.strip().strip(_MD).rstrip(",").strip(_MD)
    return "" if _PLACEHOLDER.match(v) else v


def _split_fields(text: str) -> dict[str, str]:
    fields: dict[str, list[str]] = {}
    current: str | None = None
    text = _INLINE_KEY.sub(lambda m: "\n" + m.group(1), text)
    text = _QUOTED_KEY.sub(lambda m: ("\n" + m.group(1)) if _field_of(m.group(1)) else m.group(0), text)
    for line in text.splitlines():
        sep = _SEP.search(line)
        field = _field_of(line[: sep.start()]) if sep and sep.start() <= 48 else None
        if field is not None:
            # the first non-empty answer wins; later re-statements are ignored
            current = field if not fields.get(field) else None
            if current is not None:
                value = _clean_value(line[sep.end() :])
                fields[current] = [value] if value else []
            continue
        if current is None:
            continue
        stripped = line.strip()
        if re.fullmatch(r"[\-*+•#>]+", stripped):  # a bullet left behind by splitting one-line answers
            continue
        if not stripped:
            if fields[current]:
                current = None  # a blank line ends a field that already has content
            continue
        if ANALYSIS_STOP in stripped.lower():
            current = None
            continue
        fields[current].append(_clean_value(re.sub(r"^[\-*+•]\s+", "", stripped)))
    return {k: " ".join(p for p in v if p) for k, v in fields.items()}


def _first_int(text: str) -> int | None:
    m = re.search(r"\d{1,6}", text or "")
    return int(m.group()) if m else None


def parse_failure_report(text: str, family: Family) -> FailureReport:
    """A ``FailureReport`` from the analyst's answer; never raises.

    Field names are matched in any case with the paper's and seed's synonyms, through markdown,
    bullets, numbering, JSON-ish quoting, one-line answers and extra prose. The type is normalised
    onto the family's taxonomy; with no type field, a single taxonomy name found anywhere in the
    answer is used. An unusable answer gives ``unknown`` with the raw text kept (capped).
    """
    raw = text if isinstance(text, str) else ""
    try:
        raw = _CONTROL.sub(" ", raw[:MAX_INPUT_CHARS].split(ANALYSIS_STOP)[0])
        fields = _split_fields(raw)
        ftype = normalize_failure_type(fields.get("failure_type", ""), family)
        if ftype == UNKNOWN and not fields.get("failure_type"):
            names = {
                n for n in taxonomy(family) if n != UNKNOWN and re.search(rf"\b{n}\b", raw, re.IGNORECASE)
            }
            if len(names) == 1:
                ftype = names.pop()
        step = _first_int(fields.get("critical_step", ""))
        return FailureReport(
            failure_type=ftype,
            detail=clip_text(fields.get("detail", ""), MAX_FIELD_CHARS),
            critical_step=step if step is not None and step < 100000 else None,
            lesson=clip_text(fields.get("lesson", ""), MAX_FIELD_CHARS),
            query=clip_text(fields.get("query", ""), MAX_FIELD_CHARS),
            raw=raw[:MAX_RAW_CHARS],
            source="llm",
        )
    except Exception:  # the parser must never take the training loop down
        return FailureReport(raw=raw[:MAX_RAW_CHARS] if isinstance(raw, str) else "", source="llm")
