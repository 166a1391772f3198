"""An iteration's credit: WIA's return multipliers scale the returns that the GiGPO (or GRPO) advantages
normalise, then the predictor's own rows join with theirs. WIA sits above the update's floor, so this is
where the two meet."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from roleagent_jax.rl.advantages import anchor_keys, row_advantages
from roleagent_jax.rl.group_signal import flat_groups, signal_metrics, uniform_rows
from roleagent_jax.types import Row, Trajectory
from roleagent_jax.wia.shaping import wia_multipliers, with_predictor_rows


def shaped_advantages(
    trajectories: Sequence[Trajectory],
    predictions: Any,
    rows: list[Row],
    predictor_samples: Sequence[Any],
    config: Any,
    times: dict[str, float],
) -> tuple[list[Row], np.ndarray, dict[str, float]]:
    """The rows to train on (none of an episode lost to its environment), their advantages, WIA's
    metrics and where the signal is (`group_signal.signal_metrics`); with ``train.drop_uniform_groups``
    the task groups whose episodes all end alike are left out, with ``train.drop_flat_groups`` those
    without any advantage. ``config`` is the run's; the seconds of the WIA and
    advantage passes go into ``times``."""
    c, metrics, multiplier = config, {}, None
    lost = {t.traj_id for t in trajectories if t.env_failed}  # the environment's loss, not the agent's
    rows = [r for r in rows if r.traj_id not in lost]
    start = time.perf_counter()
    if c.wia.mode != "off" and rows:
        multiplier, wia_metrics = wia_multipliers(
            trajectories, predictions, rows, c.wia.lam, c.wia.similarity, c.wia.fill
        )
        metrics.update(wia_metrics)
    times["wia"], start = time.perf_counter() - start, time.perf_counter()
    adv = row_advantages(rows, return_multiplier=multiplier, **c.advantage.to_dict())
    times["advantages"] = time.perf_counter() - start
    if rows:
        keys = anchor_keys(rows, c.advantage.anchor_similarity, c.advantage.anchor)
        metrics.update(signal_metrics(trajectories, rows, adv, keys))
    dropped = 0
    if c.train.drop_uniform_groups and rows:  # before the predictor's rows, which carry no group outcome
        rows, adv, dropped = _kept(rows, adv, ~uniform_rows(trajectories, rows), dropped)
    if c.wia.train_predictor and predictor_samples:
        rows, adv = with_predictor_rows(rows, adv, predictor_samples)
        metrics["train/predictor_rows"] = float(len(predictor_samples))
    if c.train.drop_flat_groups and rows:
        rows, adv, dropped = _kept(rows, adv, ~flat_groups(adv, [r.group_id for r in rows]), dropped)
    if c.train.drop_uniform_groups or c.train.drop_flat_groups:
        metrics["train/dropped_rows"] = float(dropped)
    return rows, adv, metrics


def _kept(
    rows: list[Row], adv: np.ndarray, keep: np.ndarray, dropped: int
) -> tuple[list[Row], np.ndarray, int]:
    """The rows (and advantages) ``keep`` marks, and the running count of those left out."""
    rows = [r for r, k in zip(rows, keep, strict=True) if k]
    return rows, adv[keep], dropped + len(keep) - len(rows)
