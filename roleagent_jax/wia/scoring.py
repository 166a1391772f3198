"""WIA scoring: how close each prediction came to the observation that followed (host-side, no JAX).

Similarity (LMS). Both texts are first normalised: lower-cased, every run of whitespace collapsed
to one space, leading/trailing space stripped. The default ``rapidfuzz`` similarity then returns
rapidfuzz's Indel normalised similarity, which is exactly ``2 * LCS(a, b) / (len(a) + len(b))``
(LCS = longest common subsequence of characters). We chose the symmetric ``2·LCS/(len a + len b)``
over ``LCS / max(len)`` because it is the quantity difflib's ``ratio()`` (the public code's scorer)
approximates -- ``2·M/T`` with M a greedy lower bound of the LCS -- so both similarities agree on short
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

SIMILARITIES = ("rapidfuzz", "difflib")  # the wia.similarity key

_WS = re.compile(r"\s+")


# ----------------------------------------------------------------------------- similarity


def normalize_text(text: str) -> str:
    """Lower-case, collapse whitespace, strip: formatting noise should not cost similarity."""
    return _WS.sub(" ", text).strip().lower()


def lms_similarity(prediction: str, actual: str, similarity: str = "rapidfuzz") -> float:
    """Normalised longest-common-subsequence similarity in [0, 1] (see the module docstring)."""
    a, b = normalize_text(prediction), normalize_text(actual)
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    if similarity == "rapidfuzz":
        return float(Indel.normalized_similarity(a, b))
    if similarity == "difflib":
        return float(difflib.SequenceMatcher(None, a, b).ratio())
    raise ValueError(f"unknown LMS similarity {similarity!r}; use one of {SIMILARITIES}")


def lms_batch(
    predictions: Sequence[str], actuals: Sequence[str], similarity: str = "rapidfuzz"
) -> np.ndarray:
    """Pairwise LMS of ``predictions[i]`` vs ``actuals[i]`` -> float64 [n] (C loop for rapidfuzz)."""
    if len(predictions) != len(actuals):
        raise ValueError(f"lms_batch needs equal lengths, got {len(predictions)} and {len(actuals)}")
    if len(predictions) == 0:
        return np.zeros((0,), np.float64)
    if similarity == "difflib":
        return np.array([lms_similarity(p, a, "difflib") for p, a in zip(predictions, actuals)], np.float64)
    if similarity != "rapidfuzz":
        raise ValueError(f"unknown LMS similarity {similarity!r}; use one of {SIMILARITIES}")
    a = [normalize_text(p) for p in predictions]
    b = [normalize_text(x) for x in actuals]
    # Indel already maps ("", "") -> 1 and (x, "") -> 0, matching lms_similarity.
    return np.asarray(process.cpdist(a, b, scorer=Indel.normalized_similarity), np.float64)


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
    similarity: str = "rapidfuzz",
) -> tuple[np.ndarray, np.ndarray, WIAStats]:
    """R_pre for every step of one episode.

    ``predictions[t][h-1]`` is the prediction made at step t for horizon h; it is compared with
    ``observations_after[t + h - 1]`` (= s_{t+h}, the observation after step t+h-1). Horizons past
    the episode's end are not scored; a None (unparsable) prediction scores 0 and is counted.
    R_pre(t) = mean over the scored horizons (or the ``discount**(h-1)``-weighted mean).
    Returns (r_pre float32 [T], mask bool [T] = step had a scored prediction, stats).
    Steps without predictions get r_pre 0 and mask False.
    """
    return score_batch([predictions], [observations_after], discount=discount, similarity=similarity)[0]


def score_batch(
    predictions: Sequence[Mapping[int, Sequence[str | None]]],
    observations_after: Sequence[Sequence[str]],
    *,
    discount: float | None = None,
    similarity: str = "rapidfuzz",
) -> list[tuple[np.ndarray, np.ndarray, WIAStats]]:
    """``score_trajectory_predictions`` for many episodes with one batched LMS call over all pairs."""
    if len(predictions) != len(observations_after):
        raise ValueError(f"{len(predictions)} prediction maps for {len(observations_after)} episodes")
    all_stats = [WIAStats() for _ in predictions]
    all_pairs = [_collect_pairs(p, o, s) for p, o, s in zip(predictions, observations_after, all_stats)]
    flat = [(p or "", a) for pairs in all_pairs for (_, _, p, a) in pairs]
    sims = lms_batch([f[0] for f in flat], [f[1] for f in flat], similarity=similarity)
    out, k = [], 0
    for pairs, obs, stats in zip(all_pairs, observations_after, all_stats):
        r_pre, mask = _aggregate(len(obs), pairs, sims[k : k + len(pairs)], discount, stats)
        k += len(pairs)
        out.append((r_pre, mask, stats))
    return out
