"""WIA prompts: what the agent writes after its action (inline mode), the predictor's answer format, how
answers are parsed, and which steps get a prediction. Host-side text only. The separate-mode question
itself is part of the environment contract (`envs.predictor_prompt`), in each family's framing."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from roleagent_jax.envs.predictor_prompt import PREDICT_STOP

INLINE_STOP = "</predict_next>"  # inline mode: the agent's answer ends after its prediction

_WS = re.compile(r"\s+")


def inline_instruction(action_stop: str) -> str:
    """WIA inline mode: after its action the agent writes the observation it expects next."""
    return f"\nAfter {action_stop}, write the observation you expect next inside <predict_next>...</predict_next>."


def format_predictions(observations: Sequence[str]) -> str:
    """Target text for the predictor role (supervised warm start); ``parse_predictions`` inverts it."""
    body = "\n".join(f"<obs{i}>{_WS.sub(' ', o).strip()}</obs{i}>" for i, o in enumerate(observations, 1))
    return f"{body}\n{PREDICT_STOP}"


_OBS_OPEN = re.compile(r"<\s*obs\s*(\d{1,3})\s*>", re.IGNORECASE)
_OBS_CLOSE = re.compile(r"<\s*/\s*obs\s*\d{0,3}\s*>|<\s*/?\s*predict\s*>", re.IGNORECASE)
_INLINE = re.compile(r"<\s*predict_next\s*>(.*?)(?:<\s*/\s*predict_next\s*>|$)", re.IGNORECASE | re.DOTALL)
_MAX_PARSE_CHARS = 20000
_MAX_PREDICTION_CHARS = 2000


def parse_predictions(text: str, horizon: int) -> list[str | None]:
    """``horizon`` predictions from a predictor answer; None where a horizon is missing or empty.

    Accepts tags in any case and spacing, a missing closing tag (text runs to the next tag or the
    end, as when generation hit its token limit), and ignores anything outside the tags. The first
    occurrence of each horizon wins. Never raises.
    """
    out: list[str | None] = [None] * max(int(horizon), 0)
    if not isinstance(text, str) or not out:
        return out
    text = text[:_MAX_PARSE_CHARS]
    opens = list(_OBS_OPEN.finditer(text))
    for i, m in enumerate(opens):
        h = int(m.group(1))
        if not 1 <= h <= len(out) or out[h - 1] is not None:
            continue
        end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
        seg = text[m.end() : end]
        close = _OBS_CLOSE.search(seg)
        if close:
            seg = seg[: close.start()]
        seg = _WS.sub(" ", seg).strip()[:_MAX_PREDICTION_CHARS]
        out[h - 1] = seg or None
    return out


def parse_inline_prediction(response: str) -> str | None:
    """The inline-mode prediction ``<predict_next>...</predict_next>`` of an agent response, or None."""
    if not isinstance(response, str):
        return None
    m = _INLINE.search(response[:_MAX_PARSE_CHARS])
    if not m:
        return None
    seg = m.group(1)
    stop = re.search(r"<\s*/?\s*(action|think|predict_next)\s*>", seg, re.IGNORECASE)
    if stop:
        seg = seg[: stop.start()]
    seg = _WS.sub(" ", seg).strip()[:_MAX_PREDICTION_CHARS]
    return seg or None


# ----------------------------------------------------------------------------- which steps predict


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def prediction_mask(
    seed: int, iteration: int, traj_ids: Sequence[int] | np.ndarray, step: int, fraction: float
) -> np.ndarray:
    """Which (trajectory, step) rows get a prediction: a stateless hash of (seed, iteration, traj, step).

    Stateless so a resumed run makes the same choices without saving an RNG. bool [len(traj_ids)].
    """
    ids = np.asarray(traj_ids, dtype=np.int64).astype(np.uint64)
    if fraction >= 1.0:
        return np.ones(ids.shape, bool)
    if fraction <= 0.0:
        return np.zeros(ids.shape, bool)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.full(ids.shape, np.uint64(seed & (2**64 - 1))))
        h = _splitmix64(h ^ np.uint64(iteration & (2**64 - 1)))
        h = _splitmix64(h ^ ids)
        h = _splitmix64(h ^ np.uint64(step & (2**64 - 1)))
    u = (h >> np.uint64(11)).astype(np.float64) / float(2**53)
    return u < fraction
