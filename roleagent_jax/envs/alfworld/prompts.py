"""The agent prompt for ALFWorld and the parser for the agent's answer.

The prompt follows the reference structure (task, step count, the last K observation/action pairs,
the current observation, the admissible commands; think in <think>, act in <action>) in few words,
because the demo's tiny model has a context of only 512-1024 tokens.
"""

from __future__ import annotations

import re

ACTION_STOP = "</action>"
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_TASK_LINE = re.compile(r"\s*Your task is to:[^\n]*", re.IGNORECASE)
_ACTION_OPEN = re.compile(r"<\s*action\s*>", re.IGNORECASE)
_ACTION_CLOSE = re.compile(r"<\s*/\s*action\s*>", re.IGNORECASE)
_TAG = re.compile(r"<\s*/?\s*[a-zA-Z_]+\s*>")
MAX_ACTION_CHARS = 200


def clean_observation(obs: str) -> str:
    """The observation without the welcome banner and the task line (the prompt states the task once)."""
    text = obs.replace(_BANNER, "")
    text = _TASK_LINE.sub("", text)
    return " ".join(text.split())


def build_agent_prompt(
    goal: str,
    history: list[tuple[str, str]],
    observation: str,
    admissible: list[str],
    step: int,
    k: int = 2,
) -> str:
    """The agent's prompt at `step` (0-based). `history` holds earlier (observation, action) pairs, oldest
    first; only the last `k` are shown."""
    lines = [
        "You are an agent in a household. Reach the goal with text commands.",
        f"Task: {goal.strip()}",
    ]
    recent = history[-k:] if k > 0 else []
    if recent:
        lines.append(f"Step {step + 1}. Your last {len(recent)} steps:")
        first = step - len(recent) + 1
        for j, (obs, act) in enumerate(recent):
            lines.append(f"[{first + j}] Saw: {clean_observation(obs)}")
            lines.append(f"[{first + j}] Did: {act}")
    else:
        lines.append(f"Step {step + 1}. No actions yet.")
    lines.append(f"Now: {clean_observation(observation)}")
    lines.append("Commands: " + " | ".join(admissible))
    lines.append(
        "Reason briefly in <think>...</think>, then give one command from the list in <action>...</action>."
    )
    return "\n".join(lines)


def normalize_action(text: str) -> str:
    """Case and whitespace do not make two commands different."""
    return " ".join(text.split()).lower()


def parse_action(response: str, admissible: list[str] | None) -> tuple[str | None, bool]:
    """(action, valid) from a model response; never raises.

    Valid means exactly one <action>...</action> block (a final unclosed block counts: the sampler may
    cut the stop string), non-empty printable ASCII content, and, when `admissible` is given, a command of
    that list after normalising case and whitespace; the list's own spelling is returned. Anything else
    returns (None, False), except an inadmissible but well-formed action, returned with valid=False.
    """
    try:
        if not isinstance(response, str):
            return None, False
        opens = list(_ACTION_OPEN.finditer(response))
        closes = list(_ACTION_CLOSE.finditer(response))
        if len(opens) != 1 or len(closes) > 1:
            return None, False
        start = opens[0].end()
        if closes:
            if closes[0].start() < start:
                return None, False
            content = response[start : closes[0].start()]
        else:
            content = response[start:]
        if _TAG.search(content):
            return None, False
        action = " ".join(content.split())
        if not action or len(action) > MAX_ACTION_CHARS or not action.isascii() or not action.isprintable():
            return None, False
        if admissible is None:
            return action, True
        wanted = normalize_action(action)
        for cmd in admissible:
            if normalize_action(cmd) == wanted:
                return cmd, True
        return action, False
    except Exception:  # the parser must never take a rollout down
        return None, False
