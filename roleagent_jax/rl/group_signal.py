"""Where an iteration's learning signal is, and the rows that carry none.

A task group whose episodes all end alike gets episode advantage 0 on every row; a step group whose
rows all get advantage 0 adds nothing to the policy gradient. Their shares say how much of an
iteration's sampling was spent without signal (DAPO drops such groups and samples more; we cannot
afford more, so we measure them and may leave them out of the update). Pure functions of arrays.

What leaving a flat group out changes: its rows' policy-gradient term is 0 anyway, so the update loses
only their KL and entropy terms (the pull toward the warm start and the entropy bonus on those
tokens) and their share of the token mean's denominator: the rows with signal then weigh more, as if
the learning rate rose by the share of tokens dropped. It saves their forward and backward passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from roleagent_jax.types import Row, Trajectory

ZERO = 1e-6  # |advantage| at or below this is no signal (float32 rounding of exact ties)


def _dense(*keys: np.ndarray) -> np.ndarray:
    """One dense id per distinct tuple of keys (each an integer array of one length)."""
    stacked = np.stack([np.asarray(k).astype(np.int64) for k in keys], axis=1)
    return np.unique(stacked, axis=0, return_inverse=True)[1].reshape(-1)


def _uniform_per_group(
    returns: Sequence[float], group_ids: Sequence[int], tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """The dense group index of each episode, and per group whether its returns are all equal."""
    returns, groups = np.asarray(returns, np.float64), _dense(group_ids)
    n = groups.max() + 1
    high = np.full(n, -np.inf)
    np.maximum.at(high, groups, returns)
    low = np.full(n, np.inf)
    np.minimum.at(low, groups, returns)
    return groups, high - low <= tol


def uniform_group_share(returns: Sequence[float], group_ids: Sequence[int], tol: float = ZERO) -> float:
    """Share of task groups (episodes with one group id) whose episode returns are all equal (within
    ``tol``): their episode-level advantage is 0 on every row. 0.0 for no episodes."""
    if len(returns) == 0:
        return 0.0
    return float(np.mean(_uniform_per_group(returns, group_ids, tol)[1]))


def uniform_rows(trajs: Sequence[Trajectory], rows: Sequence[Row], tol: float = ZERO) -> np.ndarray:
    """Per row, whether its task group's episode returns are all equal (DAPO's filter_groups drops such
    groups). Under GiGPO such a group may still hold step groups that disagree (one episode took a
    detour), so this is a superset of `flat_groups`: what it adds is that weak, shorter-path signal."""
    if not rows:
        return np.zeros(0, bool)
    groups, uniform = _uniform_per_group([t.total_reward for t in trajs], [t.group_id for t in trajs], tol)
    of_group = {int(t.group_id): bool(uniform[g]) for t, g in zip(trajs, groups, strict=True)}
    return np.array([of_group[int(r.group_id)] for r in rows], bool)


def flat_groups(adv: np.ndarray, group_ids: Sequence[int], tol: float = ZERO) -> np.ndarray:
    """Per row, whether every row of its group (same id) has advantage 0 (within ``tol``)."""
    adv, groups = np.abs(np.asarray(adv, np.float64)), _dense(group_ids)
    if adv.size == 0:
        return np.zeros(0, bool)
    largest = np.zeros(groups.max() + 1)
    np.maximum.at(largest, groups, adv)
    return largest[groups] <= tol


def zero_group_share(adv: np.ndarray, *keys: Sequence[int], tol: float = ZERO) -> float:
    """Share of the groups the ``keys`` define (rows with equal keys, e.g. task group and anchor: GiGPO's
    step groups) whose rows all have advantage 0. 0.0 for no rows."""
    adv = np.asarray(adv)
    if adv.size == 0:
        return 0.0
    groups = _dense(*keys)
    flat = flat_groups(adv, groups, tol)
    first = np.unique(groups, return_index=True)[1]
    return float(np.mean(flat[first]))


def signal_metrics(
    trajs: Sequence[Trajectory], rows: Sequence[Row], adv: np.ndarray, step_keys: np.ndarray
) -> dict[str, float]:
    """How much of the iteration's sampling carries signal: the share of task groups whose episode
    returns are all equal (`train/uniform_groups`: no episode-level advantage) and of GiGPO's step
    groups (task group x `step_keys`, `advantages.anchor_keys`) whose rows all get advantage 0
    (`train/zero_step_groups`: no policy gradient at all). The entropy of the sampled tokens is the
    update's `update/entropy`; its clip fractions are `update/clip_frac_low` and `_high`."""
    return {
        "train/uniform_groups": uniform_group_share(
            [t.total_reward for t in trajs], [t.group_id for t in trajs]
        ),
        "train/zero_step_groups": zero_group_share(adv, [r.group_id for r in rows], step_keys),
    }
