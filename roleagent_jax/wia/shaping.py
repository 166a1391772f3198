"""WIA shaping: prediction accuracy multiplies the task return, and (optionally) the predictor's answers
train with the advantage of the action they predicted."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from roleagent_jax.types import Row, Trajectory
from roleagent_jax.wia.scoring import WIAStats, score_batch

if TYPE_CHECKING:
    from roleagent_jax.sampling import SampleResult


def return_multiplier(r_pre: np.ndarray | float, lam: float = 1.0) -> np.ndarray:
    """Per-row factor ``1 + λ·R_pre`` that the advantage function applies to the step return G_t."""
    r = np.asarray(r_pre, dtype=np.float32)
    if np.any((r < 0) | (r > 1)) or not np.all(np.isfinite(r)):
        raise ValueError("R_pre values must lie in [0, 1]")
    return (1.0 + np.float32(lam) * r).astype(np.float32)


FILLS = ("group_mean", "none")  # the wia.fill key


def fill_unscored(r_pre: np.ndarray, scored: np.ndarray, group_ids: np.ndarray, fill: str) -> np.ndarray:
    """R_pre of the steps that drew no prediction (``wia.fraction`` < 1): ``group_mean`` gives them the
    mean R_pre of their task group's scored steps (0 where the group has none), ``none`` leaves them at 0
    (factor 1). With ``none`` the draw decides which of two equal winning actions is credited more
    (``benchmarks/wia_multiplier.py``); with the group's mean a step that drew none is credited as its
    group predicted, and a scored step still moves by its own prediction."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {FILLS}, got {fill!r}")
    r_pre = np.asarray(r_pre, np.float64)
    if fill == "none" or scored.all():
        return r_pre.astype(np.float32)
    groups, dense = np.unique(np.asarray(group_ids), return_inverse=True)
    total = np.bincount(dense, weights=np.where(scored, r_pre, 0.0), minlength=len(groups))
    count = np.bincount(dense, weights=scored.astype(np.float64), minlength=len(groups))
    mean = np.where(count > 0, total / np.maximum(count, 1.0), 0.0)
    return np.where(scored, r_pre, mean[dense]).astype(np.float32)


def wia_multipliers(
    trajectories: Sequence[Trajectory],
    predictions: Mapping[int, Mapping[int, Sequence[str | None]]],
    rows: Sequence[Row],
    lam: float,
    similarity: str,
    fill: str,
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-row return multipliers 1 + lam * R_pre, scored in one batched LMS call (steps that drew no
    prediction: ``fill_unscored``), and WIA metrics."""
    scored = score_batch(
        [predictions.get(t.traj_id, {}) for t in trajectories],
        [[s.next_observation for s in t.steps] for t in trajectories],
        similarity=similarity,
    )
    by_traj = {t.traj_id: (r, m) for t, (r, m, _) in zip(trajectories, scored, strict=True)}
    stats = WIAStats()
    for _, _, s in scored:
        stats.merge(s)
    r_pre_rows = np.array([by_traj[r.traj_id][0][r.step_index] for r in rows], dtype=np.float32)
    mask = np.array([bool(by_traj[r.traj_id][1][r.step_index]) for r in rows], dtype=bool)
    metrics = stats.summary()
    metrics["wia/r_pre_mean"] = float(r_pre_rows[mask].mean()) if mask.any() else 0.0
    r_pre_rows = fill_unscored(r_pre_rows, mask, np.array([r.group_id for r in rows], np.int64), fill)
    return return_multiplier(r_pre_rows, lam), metrics


def with_predictor_rows(
    rows: list[Row], adv: np.ndarray, samples: Sequence[tuple[int, int, list[int], SampleResult]]
) -> tuple[list[Row], np.ndarray]:
    """The predictor's answers as training rows, each with the advantage of the action it predicts the
    outcome of (``wia.train_predictor``): the world role learns from the same signal as the agent."""
    at = {(r.traj_id, r.step_index): i for i, r in enumerate(rows)}
    extra, extra_adv = [], []
    for traj_id, step, prompt_ids, res in samples:
        i = at[(traj_id, step)]
        extra.append(
            dataclasses.replace(
                rows[i],
                prompt_ids=prompt_ids,
                response_ids=list(res.token_ids),
                logprobs=list(res.logprobs),
                forced_tokens=0,
            )
        )
        extra_adv.append(adv[i])
    return rows + extra, np.concatenate([adv, np.asarray(extra_adv, adv.dtype)])
