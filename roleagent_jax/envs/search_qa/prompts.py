"""The agent prompt, the WIA predictor prompt and the analysis framing of search QA.

The agent prompt keeps the reference structure of Search-R1 and verl-agent's search environment
(the rules of the three tags, the question, the turn count, the earlier searches with what they
returned) in few words: the demo's tiny model reads it in a context of about a thousand tokens.
The predictor plays the search engine: given the question and a query, it writes the information
the query will bring back (the observation WIA scores).
"""

from __future__ import annotations

from collections.abc import Sequence

from roleagent_jax.envs.search_qa.engine import question_observation
from roleagent_jax.envs.search_qa.parser import ACTION_STOPS, parse_turn
from roleagent_jax.wia import PREDICT_STOP

AGENT_STOPS = ACTION_STOPS
RULES = (
    "Answer the question. Reason briefly in <think>...</think>. If you lack a fact, search with "
    "<search>query</search>; results come back in <information>...</information>. When you know the "
    "answer, give it in <answer>...</answer>, a few words only."
)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def build_agent_prompt(
    question: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    step: int,
    max_turns: int,
    k: int = 3,
    obs_chars: int = 1200,
) -> str:
    """The agent's prompt at turn `step` (0-based).

    `history` holds earlier (observation, action) pairs, oldest first, and `observation` is what the
    last action brought back; the prompt shows the last `k` actions, each followed by its result.
    """
    lines = [RULES, question_observation(question), f"Turn {step + 1} of {max_turns}."]
    results = [obs for obs, _ in history[1:]] + [observation]
    pairs = list(zip([a for _, a in history], results))[-k:] if k > 0 else []
    for action, result in pairs:
        turn = parse_turn(action)
        lines.append(turn.action if turn.valid else _clip(action, 80) or "(no action)")
        lines.append(_clip(result, obs_chars))
    if step + 1 >= max_turns:
        lines.append("Last turn: answer now.")
    return "\n".join(lines)


def build_predictor_prompt(
    question: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    action: str,
    horizon: int = 1,
    *,
    history_k: int = 1,
    obs_chars: int = 600,
) -> str:
    """The WIA prompt: act as the search engine and write what `action` will bring back.

    Same answer format as the generic predictor (<obs1>...</obs1> then PREDICT_STOP), so the shared
    parser and scorer apply. For an answer the next observation is the verdict line.
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    lines = [
        "Act as the search engine of a knowledge base. Predict the information the query returns, "
        "as 'Doc 1(Title: ...) text' lines inside <information>...</information>.",
        question_observation(question),
    ]
    for obs, act in list(history)[-history_k:] if history_k > 0 else []:
        lines.append(f"Seen: {_clip(obs, obs_chars)}")
        lines.append(f"Did: {_clip(act, 120)}")
    lines.append(f"Now: {_clip(observation, obs_chars)}")
    lines.append(f"Action: {_clip(action, 120)}")
    if horizon == 1:
        lines.append(f"Write what comes back as <obs1>...</obs1> then {PREDICT_STOP}")
    else:
        lines.append(
            f"Write the next {horizon} results (this action's, then the likely next actions') as "
            f"<obs1>...</obs1> up to <obs{horizon}>...</obs{horizon}>, then {PREDICT_STOP}"
        )
    return "\n".join(lines) + "\n"


ANALYSIS_INTRO = (
    "You review a failed attempt at answering a question with a search engine and explain why it failed."
)
