"""The agent prompt for ALFWorld and the parser for the agent's answer.

The prompt follows the reference structure (task, step count, the last K observation/action pairs,
the current observation, the admissible commands; think in <think>, act in <action>) in few words,
because the demo's tiny model has a context of only 512-1024 tokens.
"""

from __future__ import annotations

import re

from roleagent_jax.envs.text import action_block, history_lines, matching_command

ACTION_STOP = "</action>"
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_TASK_LINE = re.compile(r"\s*Your task is to:[^\n]*", re.IGNORECASE)


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
    lines += history_lines(history[-k:] if k > 0 else [], step, clean_observation)
    lines.append(f"Now: {clean_observation(observation)}")
    lines.append("Commands: " + " | ".join(admissible))
    lines.append(
        "Reason briefly in <think>...</think>, then give one command from the list in <action>...</action>."
    )
    return "\n".join(lines)


def parse_action(response: str, admissible: list[str] | None) -> tuple[str | None, bool]:
    """(action, valid) from a model response; never raises.

    Valid means exactly one <action>...</action> block (a final unclosed block counts: the sampler may
    cut the stop string), non-empty printable ASCII content, and, when `admissible` is given, a command of
    that list after normalising case and whitespace; the list's own spelling is returned. Anything else
    returns (None, False), except an inadmissible but well-formed action, returned with valid=False.
    """
    try:
        action = action_block(response)
        if action is None:
            return None, False
        if admissible is None:
            return action, True
        cmd = matching_command(action, admissible)
        return (cmd, True) if cmd is not None else (action, False)
    except Exception:  # the parser must never take a rollout down
        return None, False
