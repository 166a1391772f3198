"""The heuristic analyser on trajectories played in the real ALFWorld engine (skipped without the data).

The expert's initial plan is replayed with its clean/heat/cool step removed: the engine does not count
the placement, and the analyser must name the skipped precondition at the placing step.
"""

import pytest

from roleagent_jax.envs.alfworld.heuristic import analyse
from roleagent_jax.types import Step, Trajectory

TYPES = ["pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep"]


@pytest.fixture(scope="module")
def env_and_games(alfworld_data):
    from roleagent_jax.envs.alfworld.engine import AlfWorldEnv
    from roleagent_jax.envs.alfworld.games import list_games, task_type_of

    games = list_games(alfworld_data / "json_2.1.1" / "valid_seen")
    first = {t: next(g for g in games if task_type_of(g) == t) for t in TYPES}
    return AlfWorldEnv(max_steps=50), first


@pytest.mark.parametrize(
    "task_type", [TYPES[0], *(pytest.param(t, marks=pytest.mark.slow) for t in TYPES[1:])]
)
def test_skipped_transform_is_missing_precondition(env_and_games, task_type):
    env, games = env_and_games
    plan = list(env.reset(games[task_type], expert=True).expert_plan)
    verb = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
            "pick_cool_then_place_in_recep": "cool"}[task_type]  # fmt: skip
    assert any(a.startswith(verb + " ") for a in plan), plan
    script = [a for a in plan if not a.startswith(verb + " ")]
    now = env.reset(games[task_type], expert=False)
    steps = []
    for action in script:
        assert action in now.admissible, (action, now.admissible)
        nxt = env.step(action)
        steps.append(
            Step(now.text, [], f"<action>{action}</action>", action, True, nxt.reward, nxt.text, nxt.done)
        )
        now = nxt
    assert not now.won
    traj = Trajectory(task_id=0, task_type=task_type, goal=now.info["goal"], steps=steps)
    rep = analyse(traj)
    assert rep.failure_type == "missing_precondition", rep.detail
    assert rep.critical_step == len(script)  # the placing step, numbered from 1
    assert steps[-1].action.startswith(("put ", "move "))
