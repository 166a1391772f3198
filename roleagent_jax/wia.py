"""World-In-Agent (WIA): the policy predicts future observations; accuracy becomes a process reward.

Host-side building blocks only (no JAX): prompt construction and parsing for both prediction modes,
the LMS similarity, per-trajectory scoring and the multiplicative shaping of step returns.

Similarity (LMS). Both texts are first normalised: lower-cased, every run of whitespace collapsed
to one space, leading/trailing space stripped. The default ``rapidfuzz`` backend then returns
rapidfuzz's Indel normalised similarity, which is exactly ``2 * LCS(a, b) / (len(a) + len(b))``
(LCS = longest common subsequence of characters). We chose the symmetric ``2·LCS/(len a + len b)``
over ``LCS / max(len)`` because it is the quantity difflib's ``ratio()`` (the public code's scorer)
approximates -- ``2·M/T`` with M a greedy lower bound of the LCS -- so both backends agree on short
texts and ``difflib`` remains a drop-in comparison; it also penalises padding a prediction with extra
text, which ``LCS / max`` would only do once the prediction is the longer string.
Two empty texts are identical (1.0); exactly one empty text scores 0.0.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel

MODES = ("separate", "inline", "off")
BACKENDS = ("rapidfuzz", "difflib")

PREDICT_STOP = "</predict>"  # ends a predictor answer: "<obs1>...</obs1> ... </predict>"
INLINE_TAG = "predict_next"  # inline mode: the agent writes <predict_next>...</predict_next>

_WS = re.compile(r"\s+")


# ----------------------------------------------------------------------------- similarity


def normalize_text(text: str) -> str:
    """Lower-case, collapse whitespace, strip: formatting noise should not cost similarity."""
    return _WS.sub(" ", text).strip().lower()


def lms_similarity(prediction: str, actual: str, backend: str = "rapidfuzz") -> float:
    """Normalised longest-common-subsequence similarity in [0, 1] (see the module docstring)."""
    a, b = normalize_text(prediction), normalize_text(actual)
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    if backend == "rapidfuzz":
        return float(Indel.normalized_similarity(a, b))
    if backend == "difflib":
        return float(difflib.SequenceMatcher(None, a, b).ratio())
    raise ValueError(f"unknown LMS backend {backend!r}; use one of {BACKENDS}")


def lms_batch(predictions: Sequence[str], actuals: Sequence[str], backend: str = "rapidfuzz") -> np.ndarray:
    """Pairwise LMS of ``predictions[i]`` vs ``actuals[i]`` -> float64 [n] (C loop for rapidfuzz)."""
    if len(predictions) != len(actuals):
        raise ValueError(f"lms_batch needs equal lengths, got {len(predictions)} and {len(actuals)}")
    if len(predictions) == 0:
        return np.zeros((0,), np.float64)
    if backend == "difflib":
        return np.array([lms_similarity(p, a, "difflib") for p, a in zip(predictions, actuals)], np.float64)
    if backend != "rapidfuzz":
        raise ValueError(f"unknown LMS backend {backend!r}; use one of {BACKENDS}")
    a = [normalize_text(p) for p in predictions]
    b = [normalize_text(x) for x in actuals]
    # Indel already maps ("", "") -> 1 and (x, "") -> 0, matching lms_similarity.
    return np.asarray(process.cpdist(a, b, scorer=Indel.normalized_similarity), np.float64)


# ----------------------------------------------------------------------------- prompts and parsing


def _clip(text: str, n: int) -> str:
    text = _WS.sub(" ", text).strip()
    return text if len(text) <= n else text[: n - 3] + "..."


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
    ``framing`` (an ``envs.base.PredictorFraming``: intro, reply, replies) holds the family's words.
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    reply, replies = framing.reply, framing.replies
    lines = [framing.intro, f"Task: {_clip(goal, 160)}"]
    recent = list(history)[-history_k:] if history_k > 0 else []
    for obs, act in recent:
        lines.append(f"Seen: {_clip(obs, obs_chars)}")
        lines.append(f"Did: {_clip(act, 80)}")
    lines.append(f"Now: {_clip(observation, obs_chars)}")
    lines.append(f"Action: {_clip(action, 80)}")
    if horizon == 1:
        lines.append(f"Write {reply} to this action as <obs1>...</obs1> then " + PREDICT_STOP)
    else:
        lines.append(
            f"Write the next {horizon} {replies} (after this action, then after the likely next "
            f"actions) as <obs1>...</obs1> up to <obs{horizon}>...</obs{horizon}>, then {PREDICT_STOP}"
        )
    return "\n".join(lines) + "\n"


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


# ----------------------------------------------------------------------------- scoring


@dataclass
class WIAStats:
    """Counts for the WIA metrics; ``merge`` accumulates over the trajectories of an iteration."""

    horizon_sum: dict[int, float] = field(default_factory=dict)  # h -> sum of LMS over scored preds
    horizon_count: dict[int, int] = field(default_factory=dict)  # h -> scored predictions
    n_predicted: int = 0  # predictions asked for (steps with a prediction x horizons returned)
    n_parsed: int = 0  # of those, parsed (not None)
    n_unparsable_scored: int = 0  # None predictions inside the episode (scored 0)
    n_past_end: int = 0  # horizons beyond the episode's end (not scored)
    n_steps_scored: int = 0

    def merge(self, other: WIAStats) -> WIAStats:
        for h, v in other.horizon_sum.items():
            self.horizon_sum[h] = self.horizon_sum.get(h, 0.0) + v
        for h, c in other.horizon_count.items():
            self.horizon_count[h] = self.horizon_count.get(h, 0) + c
        self.n_predicted += other.n_predicted
        self.n_parsed += other.n_parsed
        self.n_unparsable_scored += other.n_unparsable_scored
        self.n_past_end += other.n_past_end
        self.n_steps_scored += other.n_steps_scored
        return self

    def summary(self) -> dict[str, float]:
        """Flat metrics: ``wia/lms_h{h}`` (mean LMS per horizon), ``wia/parse_rate`` and counts."""
        out: dict[str, float] = {}
        for h in sorted(self.horizon_count):
            c = self.horizon_count[h]
            out[f"wia/lms_h{h}"] = self.horizon_sum[h] / c if c else 0.0
        total_c = sum(self.horizon_count.values())
        out["wia/lms_mean"] = sum(self.horizon_sum.values()) / total_c if total_c else 0.0
        out["wia/parse_rate"] = self.n_parsed / self.n_predicted if self.n_predicted else 0.0
        out["wia/n_scored"] = float(total_c)
        out["wia/n_unparsable"] = float(self.n_unparsable_scored)
        out["wia/n_past_end"] = float(self.n_past_end)
        out["wia/n_steps_scored"] = float(self.n_steps_scored)
        return out


def _collect_pairs(
    predictions: Mapping[int, Sequence[str | None]], observations_after: Sequence[str], stats: WIAStats
) -> list[tuple[int, int, str | None, str]]:
    """(step, horizon, prediction, actual) for every in-episode prediction; past-end ones are counted."""
    T = len(observations_after)
    pairs = []
    for t, preds in predictions.items():
        if not 0 <= int(t) < T:
            raise ValueError(f"prediction for step {t} but the episode has {T} steps (0..{T - 1})")
        for h, p in enumerate(preds, start=1):
            stats.n_predicted += 1
            stats.n_parsed += p is not None
            if t + h - 1 >= T:  # s_{t+h} was never observed: the episode ended first
                stats.n_past_end += 1
                continue
            pairs.append((int(t), h, p, observations_after[t + h - 1]))
    return pairs


def _aggregate(
    T: int,
    pairs: list[tuple[int, int, str | None, str]],
    sims: np.ndarray,
    discount: float | None,
    stats: WIAStats,
) -> tuple[np.ndarray, np.ndarray]:
    num = np.zeros(T, np.float64)
    den = np.zeros(T, np.float64)
    for (t, h, p, _), s in zip(pairs, sims):
        s = 0.0 if p is None else float(s)
        stats.n_unparsable_scored += p is None
        stats.horizon_sum[h] = stats.horizon_sum.get(h, 0.0) + s
        stats.horizon_count[h] = stats.horizon_count.get(h, 0) + 1
        w = 1.0 if discount is None else discount ** (h - 1)
        num[t] += w * s
        den[t] += w
    mask = den > 0
    r_pre = np.where(mask, num / np.where(mask, den, 1.0), 0.0).astype(np.float32)
    stats.n_steps_scored += int(mask.sum())
    return r_pre, mask


def score_trajectory_predictions(
    predictions: Mapping[int, Sequence[str | None]],
    observations_after: Sequence[str],
    *,
    discount: float | None = None,
    backend: str = "rapidfuzz",
) -> tuple[np.ndarray, np.ndarray, WIAStats]:
    """R_pre for every step of one episode.

    ``predictions[t][h-1]`` is the prediction made at step t for horizon h; it is compared with
    ``observations_after[t + h - 1]`` (= s_{t+h}, the observation after step t+h-1). Horizons past
    the episode's end are not scored; a None (unparsable) prediction scores 0 and is counted.
    R_pre(t) = mean over the scored horizons (or the ``discount**(h-1)``-weighted mean).
    Returns (r_pre float32 [T], mask bool [T] = step had a scored prediction, stats).
    Steps without predictions get r_pre 0 and mask False.
    """
    return score_batch([predictions], [observations_after], discount=discount, backend=backend)[0]


def score_batch(
    predictions: Sequence[Mapping[int, Sequence[str | None]]],
    observations_after: Sequence[Sequence[str]],
    *,
    discount: float | None = None,
    backend: str = "rapidfuzz",
) -> list[tuple[np.ndarray, np.ndarray, WIAStats]]:
    """``score_trajectory_predictions`` for many episodes with one batched LMS call over all pairs."""
    if len(predictions) != len(observations_after):
        raise ValueError(f"{len(predictions)} prediction maps for {len(observations_after)} episodes")
    all_stats = [WIAStats() for _ in predictions]
    all_pairs = [_collect_pairs(p, o, s) for p, o, s in zip(predictions, observations_after, all_stats)]
    flat = [(p or "", a) for pairs in all_pairs for (_, _, p, a) in pairs]
    sims = lms_batch([f[0] for f in flat], [f[1] for f in flat], backend=backend)
    out, k = [], 0
    for pairs, obs, stats in zip(all_pairs, observations_after, all_stats):
        r_pre, mask = _aggregate(len(obs), pairs, sims[k : k + len(pairs)], discount, stats)
        k += len(pairs)
        out.append((r_pre, mask, stats))
    return out


# ----------------------------------------------------------------------------- shaping


def return_multiplier(r_pre: np.ndarray | float, lam: float = 1.0) -> np.ndarray:
    """Per-row factor ``1 + λ·R_pre`` that the advantage function applies to the step return G_t."""
    r = np.asarray(r_pre, dtype=np.float32)
    if np.any((r < 0) | (r > 1)) or not np.all(np.isfinite(r)):
        raise ValueError("R_pre values must lie in [0, 1]")
    return (1.0 + np.float32(lam) * r).astype(np.float32)
