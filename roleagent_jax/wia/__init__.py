"""World-In-Agent (WIA): the policy predicts what its actions lead to; accuracy becomes a process reward.

- `prompts`: the predictor's answer format and how answers parse (the question is `envs.predictor_prompt`);
- `scoring`: the LMS similarity of predictions to the observations that followed;
- `shaping`: return multipliers and predictor training rows;
- `predictor`: the rollout hook that puts predictor requests on the agent's sampler calls (imported from
  its module: it needs the sampler, which the families' prompt code does not).
"""

from roleagent_jax.wia.prompts import (
    INLINE_STOP,
    PREDICT_STOP,
    format_predictions,
    inline_instruction,
    parse_inline_prediction,
    parse_predictions,
    prediction_mask,
)
from roleagent_jax.wia.scoring import (
    SIMILARITIES,
    WIAStats,
    lms_batch,
    lms_similarity,
    normalize_text,
    score_batch,
    score_trajectory_predictions,
)
from roleagent_jax.wia.shaping import return_multiplier, wia_multipliers, with_predictor_rows

__all__ = [
    "INLINE_STOP", "PREDICT_STOP", "SIMILARITIES", "WIAStats", "format_predictions",
    "inline_instruction", "lms_batch", "lms_similarity", "normalize_text", "parse_inline_prediction",
    "parse_predictions", "prediction_mask", "return_multiplier", "score_batch", "score_trajectory_predictions",
    "wia_multipliers", "with_predictor_rows",
]  # fmt: skip
