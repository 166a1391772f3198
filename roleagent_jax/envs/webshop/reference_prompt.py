"""The reference runs' WebShop prompt: `WEBSHOP_TEMPLATE` (and its first-step form), slot for slot.

verl-agent and Role-Agent show the instruction, the last `history_length` pages with the actions taken
as `[Observation i: '..', Action i: '..']` lines, the current page as its strings after the instruction,
each quoted and joined by [SEP], and the available actions quoted, one per line; the model reasons in
<think> and acts in <action>. The text is written afresh to the same wording: a pretrained model's
published numbers were measured on it.
"""

from __future__ import annotations

from roleagent_jax.envs.base import Admissible, History
from roleagent_jax.envs.text import observation_action_lines
from roleagent_jax.envs.webshop.engine import SEP

_HEAD = "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment."
_REPLY = (
    "Your admissible actions of the current situation are: \n[\n{available_actions}\n].\n\n"
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully which "
    "admissible action best advances the shopping goal. This reasoning process MUST be enclosed within "
    "<think> </think> tags. \nOnce you've finished your reasoning, you should choose an admissible action "
    "for current step and present it within <action> </action> tags.\n"
)
_FIRST = (
    _HEAD + " \nYour task is to: {task_description}.\n"
    "Your current observation is: {current_observation}.\n" + _REPLY
)
_LATER = (
    _HEAD + "\nYour task is to: {task_description}.\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}.\n" + _REPLY
)
_TITLE = "WebShop"  # the search page's title, which WebShop shows before the instruction


def quoted_page(page: str, chars: int = 0) -> str:
    """A page as the reference shows it: its strings after the instruction, each quoted, joined by
    [SEP]; cut to `chars` characters when > 0."""
    parts = page.split(SEP)
    if parts and parts[0] == _TITLE:
        parts = parts[1:]
    text = SEP.join(f"'{p}'" for p in parts)
    return text if chars <= 0 or len(text) <= chars else text[: chars - 3] + "..."


def build_reference_prompt(
    goal: str, history: History, page: str, available: Admissible, step: int, k: int, history_chars: int = 0
) -> str:
    """The prompt at `step` (0-based): the first-step form when there is no history to show, else the
    template with the last `k` (page, action) pairs, their pages cut to `history_chars` when > 0."""
    actions = "\n".join(f"'{a}'," for a in available or [])
    recent = list(history)[-k:] if k > 0 else []
    if not recent:
        return _FIRST.format(
            task_description=goal, current_observation=quoted_page(page), available_actions=actions
        )
    return _LATER.format(
        task_description=goal,
        step_count=step,
        history_length=len(recent),
        action_history=observation_action_lines(recent, step, lambda p: quoted_page(p, history_chars)),
        current_step=step + 1,
        current_observation=quoted_page(page),
        available_actions=actions,
    )
