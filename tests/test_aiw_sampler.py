"""Task-sampler invariants: a distribution, a floor, decay to uniform, the cap, exact checkpoint round-trips."""

import json

import numpy as np
import pytest

from roleagent_jax.aiw import TaskSampler, apply_cap


def softmax_ref(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


def test_probs_formula_floor_and_sum():
    s = TaskSampler(10, eta=2.0, decay=0.5, temperature=0.7, epsilon=0.2, seed=0)
    s.update({3: 1.0, 4: 0.25})
    logits = np.zeros(10)
    logits[3], logits[4] = 2.0, 0.5
    ref = 0.8 * softmax_ref(logits / 0.7) + 0.02
    np.testing.assert_allclose(s.probs(), ref, rtol=1e-12)
    # decay happens before the new boost: the old boost halves, the new one is at full strength
    s.update({4: 1.0})
    np.testing.assert_allclose(s.logits[[3, 4]], [1.0, 0.25 + 2.0])


def test_random_updates_keep_invariants():
    rng = np.random.default_rng(0)
    n, eps = 40, 0.1
    s = TaskSampler(n, eta=3.0, decay=0.95, epsilon=eps, cap=0.08, seed=1, bound=4.0)
    for _ in range(60):
        boosts = {
            int(t): float(rng.uniform(0, 1)) for t in rng.choice(n, size=rng.integers(0, 8), replace=False)
        }
        s.update(boosts)
        p = s.probs()
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert p.min() >= eps / n - 1e-12
        assert p.max() <= 0.08 + 1e-12
        assert np.abs(s.logits).max() <= 4.0


def test_decays_back_to_uniform_without_failures():
    s = TaskSampler(12, eta=1.0, decay=0.8, epsilon=0.05, seed=0)
    for _ in range(5):
        s.update({0: 1.0, 1: 1.0, 2: 0.5})
    assert s.probs().max() > 2 / 12
    for _ in range(150):
        s.update({})
    np.testing.assert_allclose(s.probs(), np.full(12, 1 / 12), atol=1e-9)


def test_cap_water_filling():
    p = np.array([0.7, 0.1, 0.1, 0.05, 0.05])
    q = apply_cap(p, 0.3)
    assert q.sum() == pytest.approx(1.0) and q.max() <= 0.3 + 1e-12
    assert q[0] == pytest.approx(0.3)
    # the excess goes to the rest in proportion: they keep their relative order and ratios
    np.testing.assert_allclose(q[1:] / q[1:].sum(), p[1:] / p[1:].sum())
    # cascading: redistribution pushes another entry over the cap
    q2 = apply_cap(np.array([0.6, 0.3, 0.05, 0.05]), 0.3)
    np.testing.assert_allclose(q2, [0.3, 0.3, 0.2, 0.2])
    np.testing.assert_allclose(apply_cap(np.full(4, 0.25), 0.25), np.full(4, 0.25))
    with pytest.raises(ValueError):
        apply_cap(np.full(4, 0.25), 0.2)


def test_sampling_follows_probs_and_is_seeded():
    s = TaskSampler(6, eta=2.0, epsilon=0.1, seed=3)
    s.update({0: 1.0})
    a = TaskSampler(6, eta=2.0, epsilon=0.1, seed=3)
    a.update({0: 1.0})
    assert np.array_equal(s.sample(4), a.sample(4))
    draws = s.sample(30000, replace=True)
    freq = np.bincount(draws, minlength=6) / draws.size
    np.testing.assert_allclose(freq, s.probs(), atol=0.015)
    distinct = s.sample(6)
    assert sorted(distinct.tolist()) == list(range(6))
    with pytest.raises(ValueError):
        s.sample(7)
    # an external generator leaves the internal one untouched
    before = s.state_dict()["rng"]
    s.sample(3, rng=np.random.default_rng(0))
    assert s.state_dict()["rng"] == before


def test_state_dict_round_trip_including_rng_through_json():
    s = TaskSampler(20, eta=1.5, decay=0.9, temperature=0.5, epsilon=0.1, cap=0.2, seed=7)
    s.update({1: 1.0, 5: 0.3})
    s.sample(5)
    state = json.loads(json.dumps(s.state_dict()))  # what a JSON checkpoint would hold
    expected = [s.sample(5).tolist() for _ in range(3)]
    t = TaskSampler(20, seed=12345)
    t.load_state_dict(state)
    np.testing.assert_array_equal(t.logits, state["logits"])
    assert [t.sample(5).tolist() for _ in range(3)] == expected
    np.testing.assert_array_equal(t.probs(), s.probs())
    with pytest.raises(ValueError, match="same task pool"):
        TaskSampler(21).load_state_dict(state)


@pytest.mark.parametrize(
    "kw",
    [
        {"n_tasks": 0},
        {"n_tasks": 5, "decay": 1.5},
        {"n_tasks": 5, "temperature": 0},
        {"n_tasks": 5, "epsilon": -0.1},
        {"n_tasks": 5, "cap": 0.1},
        {"n_tasks": 5, "eta": -1},
    ],
)
def test_bad_settings_fail_clearly(kw):
    with pytest.raises(ValueError):
        TaskSampler(**kw)


def test_bad_boosts_fail_clearly():
    s = TaskSampler(3)
    with pytest.raises(ValueError, match="outside the pool"):
        s.update({3: 1.0})
    with pytest.raises(ValueError, match="not finite"):
        s.update({0: float("nan")})


def _simulate(tmp_path, unlearnable_weight: float, rounds: int = 12) -> dict[str, float]:
    """AIW rounds on a 60-task pool where heat tasks always fail, clean tasks half the time and the rest
    rarely; returns the mean per-type sampling share of the last 4 rounds."""
    from types import SimpleNamespace

    from roleagent_jax.aiw import AIWState, FailureMemory, aiw_round
    from roleagent_jax.envs import get_family
    from roleagent_jax.envs.base import Task, TaskPool
    from roleagent_jax.types import Trajectory

    family = get_family("alfworld")
    goals = {
        "pick_heat_then_place_in_recep": "put a hot {o} in countertop.",
        "pick_clean_then_place_in_recep": "put a clean {o} in cabinet.",
        "pick_cool_then_place_in_recep": "put a cool {o} in diningtable.",
        "pick_and_place_simple": "put some {o} on shelf.",
        "look_at_obj_in_light": "look at {o} under the desklamp.",
        "pick_two_obj_and_place": "put two {o} in drawer.",
    }
    win = {t: 0.95 for t in goals} | {
        "pick_heat_then_place_in_recep": 0.0,
        "pick_clean_then_place_in_recep": 0.5,
    }
    objs = ["apple", "mug", "egg", "potato", "cup", "plate", "bread", "tomato", "lettuce", "pan"]
    tasks = [Task(f"{t}/{o}", t, g.format(o=o)) for t, g in goals.items() for o in objs]
    pool = TaskPool(tasks)
    state = AIWState(TaskSampler(len(pool), eta=1.0, decay=0.9, epsilon=0.2, cap=0.05, seed=0),
                     FailureMemory(tmp_path / f"mem{unlearnable_weight}.jsonl"))  # fmt: skip
    cfg = SimpleNamespace(
        analyser="heuristic",
        retrieval="fuzzy",
        top_k=3,
        min_sim=0.0,
        self_boost=1.0,
        aggregate="max",
        unlearnable_weight=unlearnable_weight,
    )
    rng = np.random.default_rng(0)
    shares = []
    for it in range(rounds):
        played = [
            Trajectory(int(i), tasks[i].type, tasks[i].goal, won=bool(rng.random() < win[tasks[i].type]))
            for i in state.sampler.sample(12, rng)
            for _ in range(4)
        ]
        failed = [t for t in played if not t.won]
        reports = [family.analyse_failure(t, 30) for t in failed]
        aiw_round(state, failed, reports, pool, family, cfg, it, seed=0, played=played)
        shares.append(state.history[-1]["type_share"])
    return {t: float(np.mean([s[t] for s in shares[-4:]])) for t in goals}


def test_learnable_failures_gain_share_unwinnable_ones_are_not_over_boosted(tmp_path):
    weighed = _simulate(tmp_path, 0.25)
    plain = _simulate(tmp_path, 1.0)
    uniform = 1 / 6
    clean, heat = "pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep"
    # failures concentrate on clean (learnable) and heat (unwinnable): clean gains >= 5 points
    assert weighed[clean] >= uniform + 0.05, weighed
    # the unwinnable type stays below the learnable one, and below what unweighed boosting gives it
    assert weighed[heat] < weighed[clean], weighed
    assert weighed[heat] < plain[heat] - 0.03, (weighed, plain)
    # without the weighting the unwinnable type takes the most share
    assert plain[heat] > plain[clean], plain


def test_learnability_weights_and_round_trip():
    s = TaskSampler(4)
    s.record({0: 0.0, 1: 0.5, 2: 1.0})
    assert [s.learnability(t, 0.25) for t in range(4)] == [0.25, 1.0, 0.25, 1.0]
    assert s.learnability(3, 0.25, default=0.4) == 0.4
    s.record({1: 1.0})  # recent rate: half the old, half the new
    assert s.success[1] == pytest.approx(0.75)
    assert s.learnability(1, 0.0) == pytest.approx(0.75)
    state = json.loads(json.dumps(s.state_dict()))
    t = TaskSampler(4)
    t.load_state_dict(state)
    np.testing.assert_array_equal(np.isnan(t.success), np.isnan(s.success))
    assert t.success[1] == s.success[1]
    with pytest.raises(ValueError, match="task 7"):
        s.record({7: 1.0})
    with pytest.raises(ValueError, match="unlearnable_weight"):
        s.learnability(0, 1.5)


def test_learnability_selection_weighs_p_times_1_minus_p_smoothed_toward_the_task_type():
    # tasks 0-2 of type a, 3 of type b (never played), 4 of type a never played
    s = TaskSampler(5, epsilon=0.0, selection="learnability", task_types=["a", "a", "a", "b", "a"])
    s.record({0: 1.0, 1: 0.5, 2: 0.0}, plays={0: 4, 1: 4, 2: 4})
    # type a: 6 wins of 12 plays -> (6 + 1) / (12 + 2) = 0.5; each task: (wins + 2 * 0.5) / (plays + 2)
    p = np.array([(4 + 1) / 6, (2 + 1) / 6, (0 + 1) / 6, 0.5, 0.5])
    np.testing.assert_allclose(s.success_estimate(), p)
    weights = 4 * p * (1 - p)
    np.testing.assert_allclose(s.probs(), weights / weights.sum())
    s.record({0: 1.0}, plays={0: 4})  # earlier counts halve: 4 wins of 4 plays -> 2 + 4 of 2 + 4
    assert (s.wins[0], s.plays[0]) == (6.0, 6.0)
    s.configure({"eta": 1.0, "decay": 0.9, "temperature": 1.0, "epsilon": 0.0, "cap": 0.0,
                 "selection": "learnability", "selection_strength": 2.0})  # fmt: skip
    p = s.success_estimate()
    np.testing.assert_allclose(s.probs(), (4 * p * (1 - p)) ** 2 / ((4 * p * (1 - p)) ** 2).sum())


def test_learnability_multiplies_the_failure_softmax_and_keeps_the_floor():
    s = TaskSampler(4, epsilon=0.2, selection="learnability")
    s.update({1: 1.0})
    s.record({0: 1.0, 1: 1.0}, plays={0: 8, 1: 8})
    w = s.selection_weights()
    e = np.exp(s.logits) * w
    np.testing.assert_allclose(s.probs(), 0.8 * e / e.sum() + 0.2 / 4)
    assert w[2] == w[3] > w[0] == w[1]


def test_aiw_selection_ignores_the_success_counts():
    """selection="aiw" (the default) samples as before: recorded outcomes change no probability."""
    a, b = TaskSampler(10, seed=3), TaskSampler(10, seed=3)
    a.update({2: 1.0})
    b.update({2: 1.0})
    b.record({0: 1.0, 2: 0.0, 5: 0.5}, plays={0: 8, 2: 8, 5: 8})
    np.testing.assert_array_equal(a.probs(), b.probs())
    assert [a.sample(4).tolist() for _ in range(3)] == [b.sample(4).tolist() for _ in range(3)]


def test_selection_state_survives_a_checkpoint_round_trip():
    types = ["x", "y"] * 6
    s = TaskSampler(12, seed=4, selection="learnability", selection_strength=1.5, task_types=types)
    s.record({0: 1.0, 3: 0.25, 4: 0.0}, plays={0: 8, 3: 8, 4: 8})
    s.sample(3)
    state = json.loads(json.dumps(s.state_dict()))
    t = TaskSampler(12, seed=99, task_types=types)
    t.load_state_dict(state)
    assert (t.selection, t.selection_strength) == ("learnability", 1.5)
    np.testing.assert_array_equal(t.wins, s.wins)
    np.testing.assert_array_equal(t.plays, s.plays)
    np.testing.assert_array_equal(t.probs(), s.probs())
    assert [t.sample(3).tolist() for _ in range(4)] == [s.sample(3).tolist() for _ in range(4)]
    old = {k: v for k, v in state.items() if k not in ("wins", "plays", "selection", "selection_strength")}
    t.load_state_dict(old)  # a checkpoint from before selection: counts start afresh
    assert t.selection == "aiw" and not t.plays.any()


def test_bad_selection_settings_fail_naming_the_key():
    with pytest.raises(ValueError, match="aiw.selection must"):
        TaskSampler(3, selection="edge")
    with pytest.raises(ValueError, match="aiw.selection_strength"):
        TaskSampler(3, selection_strength=0.0)
    with pytest.raises(ValueError, match="2 task types for a pool of 3"):
        TaskSampler(3, task_types=["a", "b"])
