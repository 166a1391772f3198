"""The run report's evaluation table: rates with binomial standard errors and the before/after change."""

from __future__ import annotations

import math

import pytest
from ml_collections import ConfigDict

from roleagent_jax.run.report import binomial_se, curve_series, difference_se, paired_difference, write_report


def test_binomial_standard_error_matches_the_formula():
    assert math.isclose(binomial_se(0.5, 100), 0.05)
    assert math.isclose(binomial_se(0.2, 96), math.sqrt(0.2 * 0.8 / 96))
    assert binomial_se(0.0, 10) == 0.0 and math.isnan(binomial_se(0.5, 0))
    assert math.isclose(difference_se(0.5, 100, 0.6, 100), math.sqrt(0.25 / 100 + 0.24 / 100))


def test_report_shows_each_rate_and_the_difference_with_its_standard_error(tmp_path):
    counts = {"count_per_type": {"look_at_obj_in_light": 4}, "n": 100}
    host = {
        "eval": {
            "before": {"gen_seen": {"per_type": {"look_at_obj_in_light": 0.25}, "success": 0.5, **counts}},
            "after": {"gen_seen": {"per_type": {"look_at_obj_in_light": 0.5}, "success": 0.6, **counts}},
        },
    }
    text = write_report(tmp_path, ConfigDict({"algo": "roleagent"}), [], host).read_text()
    assert "| gen_seen | all | 100 | 50.0 ± 5.0 | 60.0 ± 4.9 | +10.0 ± 7.0 |" in text
    se_b, se_a = math.sqrt(0.25 * 0.75 / 4), 0.25
    expected = f"| 4 | 25.0 ± {100 * se_b:.1f} | 50.0 ± {100 * se_a:.1f} | +25.0 ± {100 * math.hypot(se_b, se_a):.1f} |"
    assert expected in text


def test_report_shows_the_family_score_with_its_standard_error(tmp_path):
    def summary(success, score, se):
        return {"per_type": {}, "count_per_type": {}, "n": 96, "success": success, "score_name": "score",
                "score": score, "score_se": se}  # fmt: skip

    host = {"eval": {"before": {"s": summary(0.5, 0.61, 0.02)}, "after": {"s": summary(0.25, 0.7, 0.031)}}}
    text = write_report(tmp_path, ConfigDict({"algo": "grpo"}), [], host).read_text()
    assert "| s | all | 96 | 50.0 ± 5.1 | 25.0 ± 4.4 | -25.0 ± 6.8 |" in text
    assert "| s | score (mean) | 96 | 61.0 ± 2.0 | 70.0 ± 3.1 | - |" in text


def test_report_tabulates_each_aiw_round_and_plots_the_mix_and_the_share_shift(tmp_path):
    history = [
        {"step": 1, "aiw/fail/entity_confusion": 6.0, "aiw/fail/navigation_loop": 2.0,
         "aiw/shift/heat": 0.01, "aiw/shift/clean": -0.03},
        {"step": 2, "aiw/fail/entity_confusion": 1.0, "aiw/fail/navigation_loop": 3.0,
         "aiw/shift/heat": 0.08, "aiw/shift/clean": -0.02},
        {"step": 3, "train/return": 1.0},  # an iteration without an AIW round adds no row
    ]  # fmt: skip
    text = write_report(tmp_path, ConfigDict({"algo": "roleagent"}), history, {}).read_text()
    assert "| 1 | 8 | entity_confusion (75%) | clean (-3.0) |" in text
    assert "| 2 | 4 | navigation_loop (75%) | heat (+8.0) |" in text
    assert "| 3 |" not in text
    assert (tmp_path / "report" / "failure_types.png").stat().st_size > 0
    assert (tmp_path / "report" / "sampling.png").stat().st_size > 0


def test_the_overall_difference_is_paired_over_the_same_games(tmp_path):
    # 8 games: 3 won before and after, 2 gained, 1 lost; the paired SE uses the per-game differences
    before = [1, 1, 1, 0, 0, 1, 0, 0]
    after = [1, 1, 1, 1, 1, 0, 0, 0]
    d = [a - b for a, b in zip(after, before, strict=True)]
    mean = sum(d) / 8
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 7 / 8)
    assert paired_difference({"wins": before}, {"wins": after}) == pytest.approx((mean, se))
    assert paired_difference({"wins": before}, {"wins": after[:4]}) is None  # not the same games

    def summary(wins):
        return {"per_type": {}, "count_per_type": {}, "n": 8, "success": sum(wins) / 8, "wins": wins}

    host = {"eval": {"before": {"s": summary(before)}, "after": {"s": summary(after)}}}
    text = write_report(tmp_path, ConfigDict({"algo": "grpo"}), [], host).read_text()
    assert f"| s | all | 8 | 50.0 ± 17.7 | 62.5 ± 17.1 | +12.5 ± {100 * se:.1f} |" in text


def test_the_learning_curve_reads_the_same_games_before_and_after_rl(tmp_path):
    history = [
        {"step": 2, "eval/s/all": 0.5, "eval/s/games": 4.0, "eval/s/a": 0.5},
        {"step": 4, "eval/s/all": 0.75, "eval/s/games": 4.0, "eval/s/a": 0.75},
    ]
    evals = {
        when: {"s": {"per_type": {}, "count_per_type": {}, "n": 6, "success": 0.5, "wins": wins}}
        for when, wins in (("before", [0, 1, 0, 0, 1, 1]), ("after", [1, 1, 1, 1, 0, 0]))
    }
    curve = curve_series(history, evals, iterations=6)
    # iteration 0 and 6: the first 4 games of the full evaluations, as the evaluations in between played
    assert curve == {"s (the first 4 games)": ([0, 2, 4, 6], [0.25, 0.5, 0.75, 1.0])}
    host = {"eval": evals, "iteration": 6}
    write_report(tmp_path, ConfigDict({"algo": "grpo"}), history, host)
    assert (tmp_path / "report" / "learning_curve.png").stat().st_size > 0


def test_the_report_plots_where_the_signal_goes_and_the_entropy(tmp_path):
    from roleagent_jax.run.report import signal_series

    history = [
        {"step": 1, "train/uniform_groups": 0.5, "train/zero_step_groups": 0.25, "update/clip_frac_low": 0.01,
         "update/clip_frac_high": 0.02, "update/entropy": 0.08, "train/return": 1.0},
        {"step": 2, "train/uniform_groups": 0.75, "update/entropy": 0.05},
    ]  # fmt: skip
    series = signal_series(history)
    assert series["uniform_groups"] == ([1, 2], [0.5, 0.75])
    assert series["zero_step_groups"] == ([1], [0.25])
    assert set(series) == {"uniform_groups", "zero_step_groups", "clip_frac_low", "clip_frac_high"}
    text = write_report(tmp_path, ConfigDict({"algo": "gigpo"}), history, {}).read_text()
    assert "![Where the signal goes" in text and "![Entropy of the sampled tokens" in text
    assert (tmp_path / "report" / "signal.png").stat().st_size > 0
    assert (tmp_path / "report" / "entropy.png").stat().st_size > 0


def test_report_shows_each_openers_probability_at_the_branch_state_first_and_last(tmp_path):
    history = [
        {"step": 1, "rollout/opener_prob/<search>/bridge": 0.02, "rollout/opener_prob/<answer>/bridge": 0.97},
        {"step": 2, "rollout/opener_prob/<search>/bridge": 0.05},
        {"step": 3, "rollout/opener_prob/<search>/bridge": 0.25, "rollout/opener_prob/<answer>/bridge": 0.7},
    ]
    text = write_report(tmp_path, ConfigDict({"algo": "gigpo"}), history, {}).read_text()
    assert "| <search> | bridge | 1: 2.0 | 3: 25.0 | +23.0 |" in text
    assert "| <answer> | bridge | 1: 97.0 | 3: 70.0 | -27.0 |" in text
    assert (tmp_path / "report" / "opener_prob.png").is_file()
