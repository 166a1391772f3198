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
