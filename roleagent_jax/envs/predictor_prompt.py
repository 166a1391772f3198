"""WIA's separate-mode question, in a family's framing: part of the environment contract (a family's
`predictor_prompt` builds it), so it lives with the environments, below WIA, and imports no JAX."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roleagent_jax.envs.text import clip_text

PREDICT_STOP = "</predict>"  # ends a predictor answer: "<obs1>...</obs1> ... </predict>"


@dataclass(frozen=True)
class PredictorFraming:
    """The family's words in WIA's predictor prompt (the rest of that prompt is generic).

    intro    the first line, casting the model as the world ("Act as the game engine. ...").
    reply    what one predicted observation is called, with its article ("the game's reply").
    replies  the plural, after a number ("game replies", as in "the next 2 game replies").
    """

    intro: str = "Act as the environment. Predict what it shows next."
    reply: str = "the environment's reply"
    replies: str = "environment replies"


def build_predictor_prompt(
    goal: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    action: str,
    horizon: int,
    *,
    framing,
    history_k: int = 1,
    obs_chars: int = 240,
) -> str:
    """The separate-mode prompt: the world model's view of one step, asking for H future observations.

    Kept short (a ~1k-context model must fit it): the task, the last ``history_k`` (observation,
    action) pairs, the current observation and the chosen action. The answer format is one tag per
    horizon, closed by ``PREDICT_STOP``; ``format_predictions`` writes the same format for warm starts.
    ``framing`` (a ``PredictorFraming``: intro, reply, replies) holds the family's words.
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    reply, replies = framing.reply, framing.replies
    lines = [framing.intro, f"Task: {clip_text(goal, 160)}"]
    recent = list(history)[-history_k:] if history_k > 0 else []
    for obs, act in recent:
        lines.append(f"Seen: {clip_text(obs, obs_chars)}")
        lines.append(f"Did: {clip_text(act, 80)}")
    lines.append(f"Now: {clip_text(observation, obs_chars)}")
    lines.append(f"Action: {clip_text(action, 80)}")
    if horizon == 1:
        lines.append(f"Write {reply} to this action as <obs1>...</obs1> then " + PREDICT_STOP)
    else:
        lines.append(
            f"Write the next {horizon} {replies} (after this action, then after the likely next "
            f"actions) as <obs1>...</obs1> up to <obs{horizon}>...</obs{horizon}>, then {PREDICT_STOP}"
        )
    return "\n".join(lines) + "\n"
