"""WIA: LMS similarity against hand computations and a plain-Python LCS, parsing, scoring, shaping."""

import difflib
import random

import numpy as np
import pytest

from roleagent_jax import wia
from roleagent_jax.envs import PredictorFraming, get_family
from roleagent_jax.envs.predictor_prompt import build_predictor_prompt
from roleagent_jax.rl.advantages import gigpo_advantages

ALFWORLD = get_family("alfworld")


def lcs_len(a: str, b: str) -> int:
    """Textbook O(len a * len b) dynamic programme: an independent LCS reference."""
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if ca == cb else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


@pytest.mark.parametrize("similarity", ["rapidfuzz", "difflib"])
def test_identical_and_disjoint(similarity):
    obs = "You arrive at countertop 1. On the countertop 1, you see a apple 1."
    assert wia.lms_similarity(obs, obs, similarity) == 1.0
    assert wia.lms_similarity("abc", "xyz", similarity) == 0.0
    assert wia.lms_similarity("", "", similarity) == 1.0
    assert wia.lms_similarity("", "abc", similarity) == 0.0
    assert wia.lms_similarity("abc", "", similarity) == 0.0
    # normalisation: case and whitespace do not matter
    assert wia.lms_similarity("  You ARRIVE\n at  desk 1.", "you arrive at desk 1.", similarity) == 1.0


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ("abcde", "ace", 2 * 3 / 8),  # LCS "ace"
        ("kitten", "sitting", 2 * 4 / 13),  # LCS "ittn"
        ("nothing happens.", "nothing happens", 2 * 15 / 31),
        ("go to desk 1", "go to desk 2", 2 * 11 / 24),
    ],
)
@pytest.mark.parametrize("similarity", ["rapidfuzz", "difflib"])
def test_hand_computed_pairs(a, b, expected, similarity):
    assert wia.lms_similarity(a, b, similarity) == pytest.approx(expected, abs=1e-12)


def test_rapidfuzz_is_2lcs_over_total_on_random_strings():
    rng = random.Random(0)
    for _ in range(200):
        a = "".join(rng.choice("ab c") for _ in range(rng.randint(1, 30)))
        b = "".join(rng.choice("abc d") for _ in range(rng.randint(1, 30)))
        na, nb = wia.normalize_text(a), wia.normalize_text(b)
        if not na and not nb:
            ref = 1.0
        elif not na or not nb:
            ref = 0.0
        else:
            ref = 2 * lcs_len(na, nb) / (len(na) + len(nb))
        assert wia.lms_similarity(a, b) == pytest.approx(ref, abs=1e-12)
        # difflib's matching count never exceeds the true LCS
        assert wia.lms_similarity(a, b, "difflib") <= ref + 1e-12


def test_difflib_backend_is_the_public_ratio():
    a, b = "you open the fridge 1. the fridge 1 is open.", "You open the fridge 1. In it, you see nothing."
    assert wia.lms_similarity(a, b, "difflib") == difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()


def test_batch_equals_scalar():
    rng = random.Random(1)
    preds = ["".join(rng.choice("xyz ") for _ in range(rng.randint(0, 12))) for _ in range(50)]
    acts = ["".join(rng.choice("xyw ") for _ in range(rng.randint(0, 12))) for _ in range(50)]
    for similarity in ("rapidfuzz", "difflib"):
        batch = wia.lms_batch(preds, acts, similarity)
        ref = [wia.lms_similarity(p, a, similarity) for p, a in zip(preds, acts)]
        np.testing.assert_allclose(batch, ref, atol=1e-12)
    assert wia.lms_batch([], []).shape == (0,)
    with pytest.raises(ValueError):
        wia.lms_batch(["a"], [])
    with pytest.raises(ValueError):
        wia.lms_similarity("a", "b", similarity="levenshtein")


def test_predictor_prompt_and_format_roundtrip():
    p = ALFWORLD.predictor_prompt(
        "put a clean apple in fridge.",
        [("You are in the middle of a room.", "go to countertop 1")],
        "You arrive at countertop 1. On the countertop 1, you see a apple 1.",
        "take apple 1 from countertop 1",
        horizon=2,
    )
    assert p.startswith(ALFWORLD.predictor_framing.intro) and "next 2 game replies" in p
    assert "put a clean apple in fridge." in p and "take apple 1 from countertop 1" in p
    assert "<obs2>" in p and wia.PREDICT_STOP in p
    assert len(p) < 1200  # must fit a tiny model's context
    framing = PredictorFraming()
    long = build_predictor_prompt(
        "g", [("x" * 5000, "y")], "z" * 5000, "a", 1, framing=framing, obs_chars=100
    )
    assert len(long) < 600
    target = wia.format_predictions(["You pick up the apple 1.", "You arrive at sinkbasin 1."])
    assert wia.parse_predictions(target, 2) == ["You pick up the apple 1.", "You arrive at sinkbasin 1."]
    with pytest.raises(ValueError):
        build_predictor_prompt("g", [], "o", "a", 0, framing=framing)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<obs1>a</obs1><obs2>b</obs2></predict>", ["a", "b"]),
        ("<OBS1> a \n b </OBS1>\n< obs2 >c</ obs2 >", ["a b", "c"]),
        ("<obs2>b</obs2><obs1>a</obs1>", ["a", "b"]),
        ("<obs1>a</obs1>", ["a", None]),
        ("<obs1>a</obs1><obs2>", ["a", None]),
        ("<obs1>truncated text", ["truncated text", None]),
        ("<obs1>a<obs2>b", ["a", "b"]),
        ("some prose <obs1>a</obs1> more prose", ["a", None]),
        ("<obs1></obs1><obs2>  </obs2>", [None, None]),
        ("<obs1>first</obs1><obs1>second</obs1>", ["first", None]),
        ("<obs3>c</obs3><obs7>x</obs7>", [None, None]),
        ("no tags at all", [None, None]),
        ("", [None, None]),
        ("<obs1>é ü 你好</obs1>", ["é ü 你好", None]),
        ("<obs1>" + "x" * 100000, ["x" * 2000, None]),
        ("<obs1>a</predict><obs2>b", ["a", "b"]),
    ],
)
def test_parse_predictions(text, expected):
    assert wia.parse_predictions(text, 2) == expected


def test_parse_predictions_never_raises_on_odd_input():
    assert wia.parse_predictions(None, 2) == [None, None]  # type: ignore[arg-type]
    assert wia.parse_predictions("<obs1>a</obs1>", 0) == []
    assert wia.parse_predictions("<obs99999>a", 2) == [None, None]


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "<think>hm</think><predict_next>You arrive at desk 1.</predict_next><action>go to desk 1</action>",
            "You arrive at desk 1.",
        ),
        ("<PREDICT_NEXT> Nothing happens. </PREDICT_NEXT>", "Nothing happens."),
        ("<predict_next>cut short", "cut short"),
        ("<predict_next>x<action>go to desk 1</action>", "x"),
        ("<predict_next></predict_next>", None),
        ("<action>look</action>", None),
        ("", None),
    ],
)
def test_parse_inline(text, expected):
    assert wia.parse_inline_prediction(text) == expected


def test_score_perfect_predictor_gives_one_on_every_scored_step():
    obs_after = [f"You arrive at place {i}. On it, you see thing {i}." for i in range(6)]
    H = 3
    preds = {
        t: [obs_after[t + h] if t + h < len(obs_after) else "whatever" for h in range(H)] for t in range(6)
    }
    r_pre, mask, stats = wia.score_trajectory_predictions(preds, obs_after)
    assert mask.all()
    np.testing.assert_array_equal(r_pre, np.ones(6, np.float32))
    s = stats.summary()
    assert s["wia/lms_h1"] == s["wia/lms_h2"] == s["wia/lms_h3"] == 1.0
    # step 4 has 1 horizon past the end, step 5 has 2: 3 ignored predictions
    assert stats.n_past_end == 3
    assert stats.horizon_count == {1: 6, 2: 5, 3: 4}


def test_past_end_ignored_and_unparsable_counted():
    obs_after = ["aaaa", "bbbb", "cccc"]
    preds = {
        0: ["aaaa", None],  # h2 unparsable -> 0, counted
        2: ["cccc", "garbage past the end"],  # h2 past the end: ignored, not even a 0
    }
    r_pre, mask, stats = wia.score_trajectory_predictions(preds, obs_after)
    np.testing.assert_allclose(r_pre, [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(mask, [True, False, True])
    assert stats.n_unparsable_scored == 1 and stats.n_past_end == 1
    assert stats.n_predicted == 4 and stats.n_parsed == 3
    assert stats.summary()["wia/parse_rate"] == 0.75
    # discounted mean weights horizon h by d**(h-1)
    r_d, _, _ = wia.score_trajectory_predictions(preds, obs_after, discount=0.5)
    np.testing.assert_allclose(r_d, [1.0 / 1.5, 0.0, 1.0], rtol=1e-6)
    with pytest.raises(ValueError):
        wia.score_trajectory_predictions({3: ["x"]}, obs_after)


def test_score_batch_matches_single_and_merges_stats():
    rng = random.Random(3)
    eps = []
    for _ in range(5):
        T = rng.randint(1, 6)
        obs = ["".join(rng.choice("abcd ") for _ in range(10)) for _ in range(T)]
        preds = {
            t: [rng.choice([None, obs[min(t, T - 1)], "zz"]) for _ in range(2)]
            for t in range(T)
            if rng.random() < 0.7
        }
        eps.append((preds, obs))
    batch = wia.score_batch([e[0] for e in eps], [e[1] for e in eps])
    total = wia.WIAStats()
    for (preds, obs), (r, m, s) in zip(eps, batch):
        r1, m1, _ = wia.score_trajectory_predictions(preds, obs)
        np.testing.assert_array_equal(r, r1)
        np.testing.assert_array_equal(m, m1)
        total.merge(s)
    assert total.n_predicted == sum(len(v) for e in eps for v in e[0].values())


def test_shaping_keeps_failures_at_zero_and_scales_success():
    r_pre = np.array([0.9, 1.0, 0.3, 0.7], np.float32)

    def shaped(rewards, gamma, lam=1.0):  # R_t = G_t * (1 + lam R_pre), as gigpo_advantages applies it
        g = np.zeros(len(rewards), np.float32)
        for t in reversed(range(len(rewards))):
            g[t] = rewards[t] + (gamma * g[t + 1] if t + 1 < len(rewards) else 0.0)
        return g * wia.return_multiplier(r_pre, lam)

    failed = shaped([0, 0, 0, 0], gamma=0.95)
    assert np.all(failed == 0.0)
    won = shaped([0, 0, 0, 10], gamma=0.5)
    g = np.array([1.25, 2.5, 5.0, 10.0])
    np.testing.assert_allclose(won, g * (1 + r_pre.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(wia.return_multiplier(r_pre, lam=0.2), 1 + 0.2 * r_pre, rtol=1e-6)
    assert wia.return_multiplier(np.zeros(3)).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        wia.return_multiplier(np.array([1.5]))
    with pytest.raises(ValueError):  # one multiplier per row
        gigpo_advantages([1.0, 2.0], [0, 0], [0, 0], [0, 1], [1, 2], [True, True], return_multiplier=[1.1])


def test_prediction_mask_is_seeded_and_hits_the_fraction():
    ids = np.arange(4000)
    m1 = wia.prediction_mask(7, 3, ids, 5, 0.25)
    assert np.array_equal(m1, wia.prediction_mask(7, 3, ids, 5, 0.25))
    assert not np.array_equal(m1, wia.prediction_mask(7, 3, ids, 6, 0.25))
    assert abs(m1.mean() - 0.25) < 0.03
    assert wia.prediction_mask(0, 0, ids, 0, 1.0).all()
    assert not wia.prediction_mask(0, 0, ids, 0, 0.0).any()


def test_unscored_steps_take_their_groups_mean_prediction_score():
    """A step that drew no prediction is credited as its task group predicted: two equal winning actions
    no longer differ by whether the draw gave one of them a prediction."""
    from roleagent_jax.wia.shaping import fill_unscored

    r_pre = np.array([0.8, 0.0, 0.4, 0.0, 0.0, 0.0])
    scored = np.array([True, False, True, False, False, False])
    groups = np.array([5, 5, 5, 9, 9, 5])
    filled = fill_unscored(r_pre, scored, groups, "group_mean")
    np.testing.assert_allclose(filled, [0.8, 0.6, 0.4, 0.0, 0.0, 0.6], rtol=1e-6)  # group 9 predicted nothing
    np.testing.assert_array_equal(fill_unscored(r_pre, scored, groups, "none"), r_pre.astype(np.float32))
    with pytest.raises(ValueError, match="fill"):
        fill_unscored(r_pre, scored, groups, "mean")
