"""The reference runs' ALFWorld prompt: `ALFWORLD_TEMPLATE` (and its first-step form), slot for slot.

verl-agent and Role-Agent show the raw observation, the last `history_length` observations with the
actions taken as `[Observation i: '..', Action i: '..']` lines, and the admissible commands quoted, one
per line, without `help`; the model reasons in <think> and acts in <action>. The text here is written
afresh to the same wording, because a pretrained model's published numbers were measured on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from roleagent_jax.envs.text import observation_action_lines

HIDDEN_COMMANDS = ("help",)  # listed by the engine, never shown by the reference prompt

_REPLY = (
    "You should first reason step-by-step about the current situation. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \nOnce you've finished your reasoning, you should choose an "
    "admissible action for current step and present it within <action> </action> tags.\n"
)
_FIRST = (
    "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action.\n" + _REPLY
)
_LATER = (
    "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
    "{task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action.\n" + _REPLY
)


def shown_commands(admissible: Sequence[str]) -> list[str]:
    """The commands the prompt lists: the engine's, less `help`."""
    return [c for c in admissible if c not in HIDDEN_COMMANDS]


def build_reference_prompt(
    goal: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    admissible: Sequence[str],
    step: int,
    k: int,
) -> str:
    """The prompt at `step` (0-based): the first-step form when there is no history to show (step 0, or
    k = 0), else the full template with the last `k` (observation, action) pairs."""
    commands = "\n ".join(f"'{c}'" for c in shown_commands(admissible))
    recent = list(history)[-k:] if k > 0 else []
    if not recent:
        return _FIRST.format(current_observation=observation, admissible_actions=commands)
    return _LATER.format(
        task_description=goal.strip(),
        step_count=step,
        history_length=len(recent),
        action_history=observation_action_lines(recent, step),
        current_step=step + 1,
        current_observation=observation,
        admissible_actions=commands,
    )
