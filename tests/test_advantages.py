"""gigpo_advantages against an independent plain-Python (float64, loops and dicts) reference."""

import math
import statistics
from collections import defaultdict

import numpy as np
import pytest

from roleagent_jax.rl.advantages import (
    gigpo_advantages,
    hash_anchor,
    similar_anchor_hashes,
)

# --------------------------------------------------------------------------------------------------
# plain-Python reference (reference section 3, written without the module's vectorised formulation)


def ref_returns(rewards, traj, step, gamma):
    rows_of = defaultdict(list)
    for i, t in enumerate(traj):
        rows_of[t].append(i)
    out = [0.0] * len(rewards)
    for rows in rows_of.values():
        running = 0.0
        for i in sorted(rows, key=lambda j: step[j], reverse=True):
            running = rewards[i] + gamma * running
            out[i] = running
    return out


def ref_normalise(values, keys, mode, singleton, std_floor=0.0):
    members = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(i)
    out = [0.0] * len(values)
    for rows in members.values():
        vals = [values[i] for i in rows]
        if len(vals) == 1:
            if singleton == "zero":
                continue
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.fmean(vals), statistics.stdev(vals)
        std = max(std, std_floor)
        for i in rows:
            out[i] = values[i] - mean if mode == "mean_norm" else (values[i] - mean) / (std + 1e-6)
    return out


def ref_withhold(adv, keys, valid):
    """Invalid rows lose their positive advantage; each key's valid rows share what was taken equally."""
    members = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(i)
    out = list(adv)
    for rows in members.values():
        ok = [i for i in rows if valid[i]]
        if not ok:
            continue
        taken = sum(max(adv[i], 0.0) for i in rows if not valid[i])
        for i in rows:
            out[i] = adv[i] + taken / len(ok) if valid[i] else min(adv[i], 0.0)
    return out


def ref_advantages(
    rewards,
    traj,
    group,
    step,
    anchor,
    valid,
    *,
    gamma,
    omega,
    mode,
    invalid_penalty,
    step_level,
    multiplier=None,
    std_floor=0.0,
    penalty_levels="both",
    credit_invalid=True,
):
    n = len(rewards)
    mult = [1.0] * n if multiplier is None else [float(m) for m in multiplier]
    returns = ref_returns(rewards, traj, step, gamma)
    total, mult_sum, length = defaultdict(float), defaultdict(float), defaultdict(int)
    for i in range(n):
        total[traj[i]] += rewards[i]
        mult_sum[traj[i]] += mult[i]
        length[traj[i]] += 1
    penalty = [0.0 if valid[i] else invalid_penalty for i in range(n)]
    ep_pen = penalty if penalty_levels in ("both", "episode") else [0.0] * n
    st_pen = penalty if penalty_levels in ("both", "step") else [0.0] * n
    score = [total[traj[i]] * mult_sum[traj[i]] / length[traj[i]] - ep_pen[i] for i in range(n)]
    step_return = [returns[i] * mult[i] - st_pen[i] for i in range(n)]
    episode = ref_normalise(score, group, mode, "unit", std_floor)
    if not credit_invalid:
        episode = ref_withhold(episode, group, valid)
    if not step_level:
        return episode
    clusters = [(group[i], anchor[i]) for i in range(n)]
    steps = ref_normalise(step_return, clusters, mode, "zero", std_floor)
    if not credit_invalid:
        steps = ref_withhold(steps, clusters, valid)
    return [episode[i] + omega * steps[i] for i in range(n)]


# --------------------------------------------------------------------------------------------------
# random batches


def random_batch(rng: np.random.Generator):
    rows = []
    n_groups = int(rng.integers(1, 7))
    group_labels = rng.choice(10_000, size=n_groups, replace=False) - 5000
    shared_pool = [int(h) for h in rng.integers(-(2**63), 2**63 - 1, size=3, dtype=np.int64)]
    next_traj = int(rng.integers(0, 1000))
    for g in group_labels:
        p_success = 0.0 if rng.random() < 0.3 else rng.random()
        dense_rewards = rng.random() < 0.25
        # Few anchors per group: repeats across time and trajectories; some shared with other groups.
        pool = [
            int(h) for h in rng.integers(-(2**63), 2**63 - 1, size=int(rng.integers(1, 5)), dtype=np.int64)
        ]
        pool += shared_pool[: int(rng.integers(0, 2))]
        for _ in range(int(rng.integers(1, 6))):
            next_traj += int(rng.integers(1, 50))
            length = int(rng.integers(1, 9))
            won = rng.random() < p_success
            offset, stride = int(rng.integers(0, 5)), int(rng.integers(1, 3))
            for t in range(length):
                if dense_rewards:
                    reward = float(rng.normal())
                else:
                    reward = 10.0 if (won and t == length - 1) else 0.0
                rows.append(
                    dict(
                        reward=reward,
                        traj=next_traj,
                        group=int(g),
                        step=offset + stride * t,
                        anchor=pool[int(rng.integers(0, len(pool)))],
                        valid=bool(rng.random() > 0.2),
                        mult=float(1.0 + rng.random()),
                    )
                )
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    return {k: [r[k] for r in rows] for k in rows[0]}


def anchor_array(anchors, form):
    a = np.asarray(anchors, dtype=np.int64)
    if form == "int64":
        return a
    if form == "uint64":
        return a.view(np.uint64)
    u = a.view(np.uint64)
    return np.stack(
        [(u >> np.uint64(32)).astype(np.uint32), (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)], 1
    )


def test_matches_plain_python_reference_on_random_batches():
    rng = np.random.default_rng(1234)
    modes = ("mean_std_norm", "mean_norm")
    seen = defaultdict(int)
    for trial in range(240):
        b = random_batch(rng)
        record_coverage(b, seen)
        kw = dict(
            gamma=0.95 if trial % 3 else float(rng.uniform(0.3, 1.0)),
            omega=1.0 if trial % 4 else float(rng.uniform(0.0, 2.0)),
            mode=modes[trial % 2],
            invalid_penalty=0.1 if trial % 5 else float(rng.uniform(0.0, 1.0)),
            step_level=trial % 7 != 0,
            std_floor=0.0 if trial % 11 else 1.0,
            penalty_levels=("both", "step", "episode")[trial % 3 if trial % 13 else 0],
            credit_invalid=trial % 6 != 5,
        )
        mult = b["mult"] if trial % 2 == (trial // 2) % 2 else None
        expected = ref_advantages(
            b["reward"], b["traj"], b["group"], b["step"], b["anchor"], b["valid"], multiplier=mult, **kw
        )
        got = gigpo_advantages(
            np.asarray(b["reward"]),
            np.asarray(b["traj"]),
            np.asarray(b["group"]),
            np.asarray(b["step"]),
            anchor_array(b["anchor"], ("int64", "uint64", "pair")[trial % 3]),
            np.asarray(b["valid"]),
            return_multiplier=None if mult is None else np.asarray(mult),
            **kw,
        )
        assert got.dtype == np.float32 and got.shape == (len(b["reward"]),)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=f"trial {trial}: {kw}")
    # The random structure really produced every case the reference rules distinguish.
    for case in (
        "singleton_group",
        "all_fail_group",
        "singleton_cluster",
        "anchor_across_trajs",
        "anchor_across_time",
    ):
        assert seen[case] >= 10, (case, dict(seen))


def record_coverage(b, seen):
    rows_in_group, success, cluster_rows = defaultdict(int), defaultdict(bool), defaultdict(list)
    for r, t, g, s, a in zip(b["reward"], b["traj"], b["group"], b["step"], b["anchor"]):
        rows_in_group[g] += 1
        success[g] |= r > 0
        cluster_rows[(g, a)].append((t, s))
    seen["singleton_group"] += sum(n == 1 for n in rows_in_group.values())
    seen["all_fail_group"] += sum(not ok for ok in success.values())
    seen["singleton_cluster"] += sum(len(v) == 1 for v in cluster_rows.values())
    seen["anchor_across_trajs"] += sum(len({t for t, _ in v}) > 1 for v in cluster_rows.values())
    seen["anchor_across_time"] += sum(len({s for _, s in v}) > 1 for v in cluster_rows.values())


def test_hand_computed_example():
    # One group, two trajectories of lengths 2 and 3; trajectory 7 wins at its last step.
    # Anchors: "A" at step 0 of both, "B" at step 1 of both, "C" alone. Row 3 is invalid.
    a, b, c = hash_anchor("A"), hash_anchor("B"), hash_anchor("C")
    rewards = [0.0, 0.0, 0.0, 0.0, 10.0]
    traj = [3, 3, 7, 7, 7]
    step = [0, 1, 0, 1, 2]
    anchor = [a, b, a, b, c]
    valid = [True, True, True, False, True]
    got = gigpo_advantages(rewards, traj, [0] * 5, step, anchor, valid, mode="mean_norm")
    # Episode scores: traj 3 -> 0, 0; traj 7 -> 10, 9.9, 10; pooled mean 29.9 / 5 = 5.98.
    score = np.array([0.0, 0.0, 10.0, 9.9, 10.0])
    a_e = score - 5.98
    # Step returns: traj 3 -> 0, 0; traj 7 -> 9.025, 9.5 - 0.1, 10.
    a_s = np.array([0.0 - 4.5125, 0.0 - 4.7, 9.025 - 4.5125, 9.4 - 4.7, 0.0])
    np.testing.assert_allclose(got, a_e + a_s, rtol=1e-6, atol=1e-6)


def test_singleton_group_and_single_row():
    got = gigpo_advantages([10.0], [0], [0], [0], [1], [True], mode="mean_std_norm")
    np.testing.assert_allclose(got, [10.0 / (1 + 1e-6)], rtol=1e-6)
    got = gigpo_advantages([0.0], [0], [0], [0], [1], [False], mode="mean_norm")
    np.testing.assert_allclose(got, [-0.1], rtol=1e-6)


def test_all_fail_group_pitfall_and_std_floor():
    # All rollouts fail; one invalid step. mean_std_norm inflates the 0.1 penalty to a large advantage,
    # exactly as the reference does; a std floor of the reward scale keeps it small.
    rewards = [0.0] * 6
    traj = [0, 0, 1, 1, 2, 2]
    valid = [True, True, True, False, True, True]
    anchors = [hash_anchor(f"s{i}") for i in range(6)]
    plain = gigpo_advantages(rewards, traj, [0] * 6, [0, 1] * 3, anchors, valid, step_level=False)
    assert plain[3] < -2.0
    floored = gigpo_advantages(
        rewards, traj, [0] * 6, [0, 1] * 3, anchors, valid, step_level=False, std_floor=10.0
    )
    assert np.all(np.abs(floored) < 0.02)


def test_multiplier_keeps_failed_group_unchanged_and_scales_successes():
    rng = np.random.default_rng(0)
    n = 8
    traj = np.repeat([0, 1], 4)
    step = np.tile(np.arange(4), 2)
    anchors = rng.integers(0, 3, size=n)
    valid = rng.random(n) > 0.3
    mult = 1.0 + rng.random(n)
    fail = np.zeros(n)
    a0 = gigpo_advantages(fail, traj, np.zeros(n, int), step, anchors, valid, mode="mean_norm")
    a1 = gigpo_advantages(
        fail, traj, np.zeros(n, int), step, anchors, valid, mode="mean_norm", return_multiplier=mult
    )
    np.testing.assert_array_equal(a0, a1)
    win = np.where(step == 3, 10.0, 0.0)
    a2 = gigpo_advantages(
        win, traj, np.zeros(n, int), step, anchors, valid, mode="mean_norm", return_multiplier=mult
    )
    assert not np.allclose(a0, a2)


def test_row_order_and_id_labels_do_not_matter():
    rng = np.random.default_rng(7)
    b = random_batch(rng)
    args = [np.asarray(b[k]) for k in ("reward", "traj", "group", "step", "anchor", "valid")]
    base = gigpo_advantages(*args)
    perm = rng.permutation(len(b["reward"]))
    shuffled = gigpo_advantages(*[x[perm] for x in args])
    np.testing.assert_allclose(shuffled, base[perm], rtol=1e-6, atol=1e-6)
    relabelled = list(args)
    relabelled[1] = args[1] * 31 + 5
    relabelled[2] = -args[2]
    np.testing.assert_allclose(gigpo_advantages(*relabelled), base, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [63, 64, 65])
def test_bucket_edges(n):
    rng = np.random.default_rng(n)
    traj = np.arange(n) // 5
    step = np.arange(n) % 5
    group = traj // 3
    rewards = np.where(rng.random(n) < 0.2, 10.0, 0.0)
    anchors = rng.integers(0, 4, size=n)
    valid = rng.random(n) > 0.1
    kw = dict(gamma=0.95, omega=1.0, mode="mean_std_norm", invalid_penalty=0.1, step_level=True)
    expected = ref_advantages(
        rewards.tolist(), traj.tolist(), group.tolist(), step.tolist(), anchors.tolist(), valid.tolist(), **kw
    )
    got = gigpo_advantages(rewards, traj, group, step, anchors, valid, **kw)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_hash_anchor_is_stable_64_bit():
    h = hash_anchor("You are in the middle of a room.")
    assert isinstance(h, int) and 0 <= h < 2**64
    hashes = [hash_anchor(f"obs {i}") for i in range(64)]
    assert np.array(hashes, np.uint64).shape == (64,)
    # A plain list of large Python ints must not be rounded through float64: distinct hashes stay distinct.
    close = [2**63 + 1, 2**63 + 2, 5]
    got = gigpo_advantages(
        [0.0, 10.0, 0.0], [0, 1, 2], [0, 0, 0], [0, 0, 0], close, [True] * 3, mode="mean_norm"
    )
    want = gigpo_advantages(
        [0.0, 10.0, 0.0], [0, 1, 2], [0, 0, 0], [0, 0, 0], [1, 2, 3], [True] * 3, mode="mean_norm"
    )
    np.testing.assert_allclose(got, want)
    assert h == hash_anchor("You are in the middle of a room.")
    assert h != hash_anchor("You are in the middle of a room")
    assert math.isclose(len({hash_anchor(str(i)) for i in range(1000)}), 1000)
    with pytest.raises(ValueError):
        hash_anchor(b"bytes")  # type: ignore[arg-type]


def test_empty_batch():
    assert gigpo_advantages([], [], [], [], np.zeros(0, np.int64), []).shape == (0,)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(mode="zscore"), "mode"),
        (dict(gamma=1.5), "gamma"),
        (dict(traj_ids=[0, 0, 1]), "duplicate"),
        (dict(group_ids=[0, 1, 1], traj_ids=[0, 0, 1], step_index=[0, 1, 0]), "more than one task group"),
        (dict(rewards=[0.0, float("nan"), 1.0]), "NaN"),
        (dict(valid=[True, True]), "rows"),
        (dict(anchor_hash=[0.5, 1.5, 2.5]), "integers"),
    ],
)
def test_bad_input_raises_clear_error(change, message):
    args = dict(
        rewards=[0.0, 0.0, 10.0],
        traj_ids=[0, 1, 2],
        group_ids=[0, 0, 0],
        step_index=[0, 0, 0],
        anchor_hash=[1, 2, 3],
        valid=[True, True, True],
    )
    kw = {k: change.pop(k) for k in ("mode", "gamma") if k in change}
    args.update(change)
    with pytest.raises(ValueError, match=message):
        gigpo_advantages(**args, **kw)


def test_similar_anchor_hashes():
    a = "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 2."
    a2 = "You arrive at countertop 1. On the countertop 1, you see an apple 1, and a knife 2."
    b = "You arrive at fridge 1. The fridge 1 is closed."
    texts = [a, a2, b, a, b, a2]
    groups = [0, 0, 0, 0, 1, 1]
    exact = similar_anchor_hashes(texts, groups, threshold=1.0)
    np.testing.assert_array_equal(exact, np.array([hash_anchor(t) for t in texts], np.uint64))
    fuzzy = similar_anchor_hashes(texts, groups, threshold=0.95)
    assert fuzzy[0] == fuzzy[1] == fuzzy[3] == hash_anchor(a)  # near-duplicate joins the first seen
    assert fuzzy[2] != fuzzy[0]
    assert fuzzy[5] == hash_anchor(a2)  # group 1 starts its own representatives
    got = gigpo_advantages(
        [0.0, 0.0, 0.0, 10.0, 0.0, 10.0], [0, 1, 2, 3, 4, 5], groups, [0] * 6, fuzzy, [True] * 6
    )
    assert got.shape == (6,)
    with pytest.raises(ValueError, match="threshold"):
        similar_anchor_hashes(texts, groups, threshold=0.0)


def test_stabilisers_withhold_invalid_credit_and_damp_negative_advantages():
    # A won episode with an invalid detour: GiGPO credits the detour like the winning actions.
    rewards = np.array([0.0, 0.0, 0.0, 10.0, 0.0, 0.0], np.float32)
    args = (
        rewards, np.array([0, 0, 0, 0, 1, 1]), np.zeros(6, int), np.array([0, 1, 2, 3, 0, 1]),
        np.arange(6, dtype=np.uint64), np.array([True, False, True, True, False, True]),
    )  # fmt: skip
    valid = args[-1]
    adv = gigpo_advantages(*args, mode="mean_norm")
    assert adv[1] > 0  # the published credit: the invalid row of the won episode is reinforced
    withheld = gigpo_advantages(*args, mode="mean_norm", credit_invalid=False, step_level=False)
    episode = gigpo_advantages(*args, mode="mean_norm", step_level=False)
    assert withheld[1] == 0.0 and withheld[4] == episode[4] < 0  # a lost episode's invalid row stays negative
    # what row 1 lost goes to the four valid rows in equal shares: the group still sums to zero
    np.testing.assert_allclose(withheld[valid], episode[valid] + episode[1] / 4, rtol=1e-6)
    assert abs(withheld.sum()) < 1e-5 and abs(gigpo_advantages(*args, credit_invalid=False).sum()) < 1e-5
    damped = gigpo_advantages(*args, mode="mean_norm", negative_scale=0.1)
    np.testing.assert_allclose(damped, np.where(adv < 0, 0.1 * adv, adv), rtol=1e-6)
    assert (adv < 0).any() and damped.dtype == np.float32
    np.testing.assert_array_equal(
        gigpo_advantages(*args, mode="mean_norm", negative_scale=0.0), np.maximum(adv, 0)
    )
    with pytest.raises(ValueError, match="negative_scale"):
        gigpo_advantages(*args, negative_scale=1.5)


SETTINGS = [
    dict(mode=mode, step_level=step_level, invalid_penalty=p, penalty_levels=levels, credit_invalid=credit)
    for mode in ("mean_norm", "mean_std_norm")
    for step_level in (True, False)
    for p in (0.0, 0.1, 2.0)
    for levels in ("both", "step", "episode")
    for credit in (True, False)
]


def test_every_group_sums_to_zero_in_every_setting():
    """Each task group of two or more rows sums to zero, for every combination of the settings and with
    or without WIA's multiplier (negative_scale=1): nothing after the normalisation tilts an update."""
    rng = np.random.default_rng(99)
    batches = [random_batch(rng) for _ in range(4)]
    checked = 0
    for b in batches:
        groups = np.asarray(b["group"])
        labels, counts = np.unique(groups, return_counts=True)
        for kw in SETTINGS:
            for mult in (None, np.asarray(b["mult"])):
                adv = gigpo_advantages(
                    np.asarray(b["reward"]), np.asarray(b["traj"]), groups, np.asarray(b["step"]),
                    anchor_array(b["anchor"], "int64"), np.asarray(b["valid"]), return_multiplier=mult, **kw,
                )  # fmt: skip
                scale = 1.0 + np.abs(adv).max()
                for g in labels[counts >= 2]:
                    assert abs(adv[groups == g].sum()) < 1e-5 * scale * counts.max(), (kw, g, mult is None)
                    checked += 1
    assert checked > 500


def test_all_fail_group_without_penalty_is_exactly_zero():
    rng = np.random.default_rng(3)
    n = 24
    traj = np.repeat(np.arange(4), 6)
    args = (
        np.zeros(n),
        traj,
        np.zeros(n, int),
        np.tile(np.arange(6), 4),
        rng.integers(0, 4, n),
        rng.random(n) > 0.5,
    )
    for kw in (s for s in SETTINGS if s["invalid_penalty"] == 0.0):
        for mult in (None, 1.0 + rng.random(n)):
            adv = gigpo_advantages(*args, return_multiplier=mult, **kw)
            np.testing.assert_array_equal(adv, np.zeros(n, np.float32), err_msg=str(kw))
