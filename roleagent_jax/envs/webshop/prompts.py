"""The compact agent prompt for WebShop, its parser ("available" rule), and the WIA predictor framing.

The prompt follows the reference structure (the task, the last K pages and actions, the current page,
the available actions; think in <think>, act in <action>) in few words: the demo's tiny model has a
context of only about a thousand tokens, and a results page alone is a few hundred.
"""

from __future__ import annotations

from collections.abc import Sequence

from roleagent_jax.envs.base import Admissible, History
from roleagent_jax.envs.predictor_prompt import PredictorFraming
from roleagent_jax.envs.text import action_block, clip_text, history_lines, matching_command, normalize_action
from roleagent_jax.envs.webshop.engine import SEARCH_PLACEHOLDER, split_action

ACTION_STOP = "</action>"

PREDICTOR_FRAMING = PredictorFraming(
    intro="Act as the shop website. Predict the page it shows next.",
    reply="the page the website shows after this action",
    replies="pages the website shows",
)


def build_agent_prompt(
    goal: str,
    history: History,
    observation: str,
    admissible: Admissible,
    step: int,
    k: int = 2,
    history_chars: int = 0,
) -> str:
    """The compact prompt at `step` (0-based); `history` holds earlier (page, action) pairs, oldest first,
    of which the last `k` are shown, their pages cut to `history_chars` characters when > 0."""
    lines = [
        "You are shopping on a website. Buy the product the instruction asks for.",
        f"Instruction: {goal}",
    ]
    recent = list(history)[-k:] if k > 0 else []
    lines += history_lines(recent, step, lambda obs: clip_text(obs, history_chars))
    lines.append(f"Page: {' '.join(observation.split())}")
    if admissible is not None:
        lines.append("Actions: " + " | ".join(admissible))
    lines.append(
        "Reason briefly in <think>...</think>, then give one action in <action>...</action>"
        " (to search, write search[your keywords])."
    )
    return "\n".join(lines)


def parse_action(response: str, admissible: Sequence[str] | None) -> tuple[str | None, bool]:
    """(action, valid) from a model response; never raises.

    The response must hold exactly one <action>...</action> block (a final unclosed one counts: the
    sampler may cut the stop string) with ``search[keywords]`` or ``click[element]`` inside. Valid
    means: a click on one of `admissible` (case and spaces ignored; the list's spelling is returned),
    or a search with real keywords where the list offers the search bar. With `admissible` None only
    the format is checked. A well-formed but unavailable action comes back with valid=False.
    """
    try:
        text = action_block(response)
        if text is None:
            return None, False
        parsed = split_action(text)
        if parsed is None:
            return None, False
        kind, arg = parsed
        action = f"{kind}[{arg}]"
        if admissible is None:
            return action, True
        if kind == "search":
            ok = SEARCH_PLACEHOLDER in admissible and normalize_action(action) != normalize_action(
                SEARCH_PLACEHOLDER
            )
            return action, ok
        cmd = matching_command(action, admissible)
        return (cmd, True) if cmd is not None else (action, False)
    except Exception:  # the parser must never take a rollout down
        return None, False
