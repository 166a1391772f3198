"""Faulty experts on generated games: each one's known mistake is the label the heuristic analyser gives."""

import pytest

from roleagent_jax.envs import get_family
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv
from roleagent_jax.envs.alfworld.faulty import MISTAKES, applicable, play_faulty
from roleagent_jax.envs.alfworld.heuristic import analyse
from roleagent_jax.envs.alfworld.procgen import generated_pool

MAX_STEPS = 10


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Every mistake once, on the first generated game it applies to (one game per task type)."""
    pool = generated_pool(tmp_path_factory.mktemp("games"), n=6, seed=5)
    # Under the availability rule a refused command is recorded as an invalid step (the reference's
    # format rule would accept it; the labels below do not depend on which).
    env, family = AlfWorldEnv(MAX_STEPS), get_family("alfworld").configured({"valid": "available"})
    out = []
    for mistake in MISTAKES:
        i = next(i for i, t in enumerate(pool.tasks) if applicable(t, mistake))
        out += play_faulty(family, pool.subset([i]), env, [mistake], max_steps=MAX_STEPS)
    return out


def test_every_mistake_is_played_and_fails(labelled):
    assert sorted(m for _, m, _ in labelled) == sorted(MISTAKES)
    assert all(not tr.won and tr.steps for tr, _, _ in labelled)


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_heuristic_labels_each_faulty_expert(labelled, mistake):
    tr, _, label = next(x for x in labelled if x[1] == mistake)
    rep = analyse(tr, MAX_STEPS)
    assert rep.failure_type == label, (rep.detail, [(s.action, s.next_observation[:40]) for s in tr.steps])


def test_the_loop_records_refused_commands_as_parsed(labelled):
    """What the model wrote survives in the trajectory: refused commands parsed, malformed ones not."""
    repeat = next(tr for tr, m, _ in labelled if m == "repeat_refused")
    refused = [s for s in repeat.steps if not s.valid]
    assert refused and all(s.parsed and s.action and s.action.startswith("take ") for s in refused)
    malformed = next(tr for tr, m, _ in labelled if m == "malformed")
    assert any(not s.parsed and s.action is None for s in malformed.steps)
    assert all(s.parsed == (s.action is not None) for tr, _, _ in labelled for s in tr.steps)
