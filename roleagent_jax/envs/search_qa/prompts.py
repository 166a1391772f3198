"""The compact agent prompt, the WIA predictor framing and the analysis framing of search QA.

The compact prompt keeps the reference structure of Search-R1 and verl-agent's search environment
(the rules of the three tags, the question, the turn number, the earlier searches with what they
returned) in few words: the demo's tiny model reads it in a context of about a thousand tokens. The
reference wording is `reference_prompt.py`.
The predictor plays the search engine: given the question and a query, it writes the information
the query will bring back (the observation WIA scores); WIA's generic prompt takes these words.
"""

from __future__ import annotations

from collections.abc import Sequence

from roleagent_jax.envs.predictor_prompt import PredictorFraming
from roleagent_jax.envs.search_qa.engine import question_observation
from roleagent_jax.envs.search_qa.parser import parse_turn
from roleagent_jax.envs.text import clip_text

RULES = (
    "Answer the question. Reason briefly in <think>...</think>. If you lack a fact, search with "
    "<search>query</search>; results come back in <information>...</information>. When you know the "
    "answer, give it in <answer>...</answer>, a few words only."
)


def recent_turns(history: Sequence[tuple[str, str]], observation: str, k: int) -> list[tuple[str, str]]:
    """The last `k` earlier turns as (action, what it brought back): `history` holds (observation,
    action) pairs, oldest first, and `observation` is what the last action brought back."""
    results = [obs for obs, _ in history[1:]] + [observation]
    return list(zip([a for _, a in history], results))[-k:] if k > 0 else []


def build_agent_prompt(
    question: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    step: int,
    k: int = 3,
    passage_chars: int = 0,
) -> str:
    """The compact prompt at turn `step` (0-based): the last `k` actions, each followed by its result,
    the retrieved text cut to `passage_chars` characters when > 0 (whitespace collapsed either way)."""
    lines = [RULES, question_observation(question), f"Turn {step + 1}."]
    for action, result in recent_turns(history, observation, k):
        turn = parse_turn(action)
        lines.append(turn.action if turn.valid else clip_text(action, 80) or "(no action)")
        lines.append(clip_text(result, passage_chars))
    return "\n".join(lines)


PREDICTOR_FRAMING = PredictorFraming(
    intro="Act as the search engine. Predict the passages the query brings back.",
    reply="what the search returns",
    replies="search results",
)
ANALYSIS_INTRO = (
    "You review a failed attempt at answering a question with a search engine and explain why it failed."
)
