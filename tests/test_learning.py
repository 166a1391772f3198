"""The whole RL loop learns: training success on key-note tasks rises from chance to most episodes won.

Every part of the update has its own test, but a sign error in an advantage, a mask shifted by a token
or a stale old log-prob would pass them all and leave every run flat. This test trains a tiny model with
the real trainer from a warm start on random valid actions (chance: 1 in 6) and asserts the rise; the
same run with the advantages zeroed or sign-flipped stays at chance (the slow tests below), so the rise
is the advantages' doing.
"""

from __future__ import annotations

import numpy as np
import pytest
from keylearning import run_learning

CHANCE_AT_MOST = 0.30
# Most episodes, not all: the run's path is chaotic. A machine reproduces its own path to the last digit,
# alone or inside the full suite (the same 30 figures both ways, ending at 0.906), but the path differs
# between machines (XLA's CPU kernels): one ended at 0.63, where one or two of the six notes stayed
# unlearned because their groups of 8 all failed alike. Broken advantages stay below 0.30.
LEARNED_AT_LEAST = 0.60


def test_rl_takes_key_note_success_from_chance_to_most_episodes(tmp_path):
    curve = run_learning(tmp_path)
    assert curve.valid_rate[0] >= 0.7, curve  # the warm start acts validly ...
    assert curve.start <= CHANCE_AT_MOST, curve  # ... but at chance
    assert curve.end >= LEARNED_AT_LEAST, curve


@pytest.fixture(params=["zeroed", "flipped"])
def broken_advantages(request, monkeypatch):
    """The trainer's advantage function with its output zeroed or its sign flipped."""
    from roleagent_jax.wia import credit

    real = credit.row_advantages
    scale = {"zeroed": 0.0, "flipped": -1.0}[request.param]
    monkeypatch.setattr(credit, "row_advantages", lambda *a, **k: scale * np.asarray(real(*a, **k)))
    return request.param


@pytest.mark.slow
def test_without_the_right_advantages_success_stays_at_chance(broken_advantages, tmp_path):
    curve = run_learning(tmp_path)
    assert max(curve.success[-2:]) <= CHANCE_AT_MOST, (broken_advantages, curve)


@pytest.mark.slow
def test_lora_adapters_alone_learn_the_key_note(tmp_path):
    """Rank-8 adapters on a frozen warm-started base learn the same task. They need a larger step than
    full fine-tuning (lr 1e-3 stayed near chance, 5e-3 and 1e-2 collapsed to invalid text) and 40
    iterations rather than 30 (docs/experiments.md)."""
    curve = run_learning(tmp_path, {"lora.rank": 8, "lora.alpha": 16.0, "optim.lr": 3e-3, "iterations": 40})
    assert curve.valid_rate[0] >= 0.7, curve
    assert curve.start <= CHANCE_AT_MOST, curve
    assert curve.end >= LEARNED_AT_LEAST, curve
