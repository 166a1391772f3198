"""The waste an iteration logs, on hand-made groups with hand-counted answers."""

import numpy as np

from roleagent_jax.rl.advantages import gigpo_advantages
from roleagent_jax.rl.group_signal import (
    flat_groups,
    signal_metrics,
    uniform_group_share,
    uniform_rows,
    zero_group_share,
)
from roleagent_jax.types import Row, Step, Trajectory


def test_uniform_groups_are_those_whose_returns_are_all_equal():
    # group 7: all won (10, 10, 10); group 3: 0 and 10; group 5: all lost; group 9: one episode
    returns = [10.0, 10.0, 10.0, 0.0, 10.0, 0.0, 0.0, 4.5]
    groups = [7, 7, 7, 3, 3, 5, 5, 9]
    assert uniform_group_share(returns, groups) == 3 / 4
    assert uniform_group_share([1.0, 1.0 + 1e-9], [0, 0]) == 1.0  # float ties are ties
    assert uniform_group_share([], []) == 0.0


def test_zero_advantage_step_groups_and_flat_task_groups():
    adv = np.array([0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 2e-7, 0.5])
    task = [0, 0, 0, 0, 1, 1, 1, 2]
    anchor = [11, 11, 12, 12, 11, 13, 13, 11]
    # step groups: (0,11) zero, (0,12) not, (1,11) zero, (1,13) zero (2e-7 is rounding), (2,11) not
    assert zero_group_share(adv, task, anchor) == 3 / 5
    np.testing.assert_array_equal(flat_groups(adv, task), [False] * 4 + [True] * 3 + [False])
    assert zero_group_share(np.zeros(0), [], []) == 0.0


def test_signal_metrics_of_gigpo_advantages_match_the_hand_count():
    """Two task groups of two one-step episodes from one state: the group that ends alike gets advantage 0
    on every row, so its one step group is zero; the other group's is not."""
    trajs = [Trajectory(0, "t", "g", won=w, group_id=g, traj_id=i) for i, (g, w) in enumerate(
        [(0, True), (0, True), (1, True), (1, False)])]  # fmt: skip
    rewards = [10.0, 10.0, 10.0, 0.0]
    for t, r in zip(trajs, rewards):
        t.steps = [Step("obs", None, "go", "go", True, r, "next", done=True)]
    rows = [Row([1], [2], [0.0], i, g, 0, 0, 5, r, True, True) for i, (g, r) in enumerate(
        zip([0, 0, 1, 1], rewards))]  # fmt: skip
    adv = gigpo_advantages(
        np.array(rewards, np.float32), np.arange(4), np.array([0, 0, 1, 1]), np.zeros(4, int),
        np.full(4, 5, np.uint64), np.ones(4, bool),
    )  # fmt: skip
    keys = np.array([r.anchor_hash for r in rows], np.uint64)
    out = signal_metrics(trajs, rows, np.asarray(adv), keys)
    assert out == {"train/uniform_groups": 0.5, "train/zero_step_groups": 0.5}


def test_uniform_rows_cover_won_groups_whose_detour_keeps_step_credit():
    """Group 0: both episodes win, one by a detour (a longer path), so GiGPO's step groups still disagree
    and `flat_groups` keeps its rows; `uniform_rows` drops them with group 2 (both lost) and keeps group 1,
    whose outcomes differ."""
    trajs = [Trajectory(0, "t", "g", won=w, group_id=g, traj_id=i) for i, (g, w) in enumerate(
        [(0, True), (0, True), (1, True), (1, False), (2, False), (2, False)])]  # fmt: skip
    for t in trajs:
        t.steps = [Step("obs", None, "go", "go", True, 10.0 * t.won, "next", done=True)]
    # rows: group 0 two steps then one (the detour is the extra step), group 1 and 2 one each
    group_of = [0, 0, 0, 1, 1, 2, 2]
    traj_of = [0, 0, 1, 2, 3, 4, 5]
    rows = [Row([1], [2], [0.0], t, g, 0, 0, 5, 0.0, True, True) for t, g in zip(traj_of, group_of)]
    np.testing.assert_array_equal(uniform_rows(trajs, rows), [True] * 3 + [False] * 2 + [True] * 2)
    adv = np.array([-0.3, 0.2, 0.4, 1.0, -1.0, 0.0, 0.0])  # group 0's step credit of the detour
    np.testing.assert_array_equal(flat_groups(adv, group_of), [False] * 5 + [True] * 2)
    assert uniform_rows(trajs, []).size == 0


def test_the_credit_leaves_uniform_groups_out_only_when_asked():
    """`shaped_advantages` under gigpo: group 0 all won (one by a detour), group 1 split. Off, every row
    trains; `train.drop_uniform_groups` leaves group 0's rows out and keeps group 1's with the same
    advantages."""
    from conftest import load_config

    from roleagent_jax.config import apply_algo
    from roleagent_jax.wia.credit import shaped_advantages

    trajs = [Trajectory(0, "t", "g", won=w, group_id=g, traj_id=i) for i, (g, w) in enumerate(
        [(0, True), (0, True), (1, True), (1, False)])]  # fmt: skip
    plans = [[("a", 0.0), ("b", 10.0)], [("a", 0.0), ("c", 0.0), ("b", 10.0)], [("a", 10.0)], [("d", 0.0)]]
    rows = []
    for t, plan in zip(trajs, plans):
        t.steps = [
            Step(f"o{k}", None, a, a, True, r, "next", done=k == len(plan) - 1)
            for k, (a, r) in enumerate(plan)
        ]
        last = len(plan) - 1
        ids = (t.traj_id, t.group_id, t.group_id)
        rows += [
            Row([1], [2], [0.0], *ids, k, k + 1, r, True, k == last, anchor=f"o{k}")
            for k, (_, r) in enumerate(plan)
        ]
    c = load_config("base")
    c.algo = "gigpo"
    c = apply_algo(c)
    kept, adv, metrics = shaped_advantages(trajs, None, rows, [], c, {})
    assert len(kept) == len(rows) and "train/dropped_rows" not in metrics
    assert np.abs(adv[:5]).max() > 0  # group 0's detour: step credit although both episodes won
    c.train.drop_uniform_groups = True
    kept2, adv2, metrics2 = shaped_advantages(trajs, None, rows, [], c, {})
    assert [r.group_id for r in kept2] == [1, 1] and metrics2["train/dropped_rows"] == 5.0
    np.testing.assert_allclose(adv2, adv[5:])
