"""Text pieces that families with an `<action>` answer format share: the answer's action block, the
reference runs' format rule, the case- and space-blind comparison of commands, the numbered history
lines of an agent prompt, and the one-line clipping every prompt uses for long texts.

A family's own parser decides what a valid action is; these only find it, so every family reads the
answer format the same way (and never raises on what a model writes).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_ACTION_OPEN = re.compile(r"<\s*action\s*>", re.IGNORECASE)
_ACTION_CLOSE = re.compile(r"<\s*/\s*action\s*>", re.IGNORECASE)
_TAG = re.compile(r"<\s*/?\s*[a-zA-Z_]+\s*>")
_CJK = re.compile(r"[\u4e00-\u9fff]")
MAX_ACTION_CHARS = 200  # an action longer than this is not one; an unparsed response is sent cut to it
VALIDITY_RULES = ("format", "available")  # the reference runs' rule | the action must be available


def action_block(response: object) -> str | None:
    """The content of the response's single <action>...</action> block, whitespace collapsed; None when
    there is not exactly one block (a final unclosed one counts: the sampler may cut the stop string), it
    holds another tag, or its content is empty, longer than MAX_ACTION_CHARS, or not printable ASCII."""
    if not isinstance(response, str):
        return None
    opens = list(_ACTION_OPEN.finditer(response))
    closes = list(_ACTION_CLOSE.finditer(response))
    if len(opens) != 1 or len(closes) > 1:
        return None
    start = opens[0].end()
    if closes and closes[0].start() < start:
        return None
    content = response[start : closes[0].start()] if closes else response[start:]
    if _TAG.search(content):
        return None
    action = " ".join(content.split())
    if not action or len(action) > MAX_ACTION_CHARS or not action.isascii() or not action.isprintable():
        return None
    return action


def reference_action(response: object) -> tuple[str | None, bool]:
    """(action, well formed) as the reference runs project an answer: the action is the text between the
    first `<action>` and the first `</action>` after it (the sampler keeps that stop string), whitespace
    collapsed; the answer is well formed when it also holds `<think>` and `</think>` and no CJK character.
    Whether the action is available plays no part: the env answers an unavailable one."""
    if not isinstance(response, str):
        return None, False
    opened = _ACTION_OPEN.search(response)
    closed = _ACTION_CLOSE.search(response, opened.end()) if opened else None
    if closed is None:
        return None, False
    action = " ".join(response[opened.end() : closed.start()].split())
    if not action or len(action) > MAX_ACTION_CHARS:
        return None, False
    formed = "<think>" in response and "</think>" in response and not _CJK.search(response)
    return action, formed


def clip_text(text: str, n: int) -> str:
    """`text` on one line (whitespace runs collapsed to one space), cut to `n` characters ending in
    "..." when longer; n <= 0 keeps it whole. Prompts show observations and answers this way, so one
    long page or runaway answer cannot crowd out the rest."""
    text = " ".join(text.split())
    return text if n <= 0 or len(text) <= n else text[: n - 3] + "..."


def normalize_action(text: str) -> str:
    """Case and whitespace do not make two commands different."""
    return " ".join(text.split()).lower()


def matching_command(action: str, commands: Sequence[str]) -> str | None:
    """The command of `commands` equal to `action` up to case and whitespace, in the list's spelling."""
    wanted = normalize_action(action)
    for cmd in commands:
        if normalize_action(cmd) == wanted:
            return cmd
    return None


def history_lines(
    recent: Sequence[tuple[str, str]], step: int, show: Callable[[str], str] = str
) -> list[str]:
    """The prompt's step header and the last (observation, action) pairs, numbered by step (1-based):
    `recent` is already cut to the window, `show` renders an observation."""
    if not recent:
        return [f"Step {step + 1}. No actions yet."]
    lines = [f"Step {step + 1}. Your last {len(recent)} steps:"]
    first = step - len(recent) + 1
    for j, (obs, act) in enumerate(recent):
        lines.append(f"[{first + j}] Saw: {show(obs)}")
        lines.append(f"[{first + j}] Did: {act}")
    return lines


def observation_action_lines(
    recent: Sequence[tuple[str, str]], step: int, show: Callable[[str], str] = str
) -> str:
    """The reference prompts' history: `[Observation i: '..', Action i: '..']` per pair of `recent`
    (already cut to the window), numbered by the step it was taken at (1-based); `show` renders an
    observation."""
    first = step - len(recent) + 1
    return "\n".join(
        f"[Observation {first + j}: '{show(obs)}', Action {first + j}: '{act}']"
        for j, (obs, act) in enumerate(recent)
    )
