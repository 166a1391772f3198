"""The worker pool: parallel slots, exact resets, crash and hang recovery, no JAX in workers."""

import os
import signal
import time

import jax  # noqa: F401  (the parent holds JAX; the workers must not)
import pytest

from roleagent_jax.envs import EnvPool, TaskPool, get_family
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv

ALFWORLD = get_family("alfworld")


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> TaskPool:
    return ALFWORLD.task_pool(
        "gen_seen", gen_dir=tmp_path_factory.mktemp("pool_games"), n=2, seed=7, options={"num_receptacles": 4}
    )


def test_pool_matches_single_process_env(games):
    """Same game, same actions: the pool's answers equal an in-process AlfWorldEnv's."""
    ref = AlfWorldEnv(max_steps=50)
    with EnvPool(ALFWORLD, games, num_workers=2, step_timeout=60) as pool:
        resets = pool.reset([1, 0, 1])
        for slot, task in enumerate([1, 0, 1]):
            assert resets[slot] == ref.reset(games[task])
        for k in range(3):
            actions = {s: resets[s].admissible[k] for s in range(3)}
            out = pool.step(actions)
            assert out[2] == ref.step(actions[2])  # slot 2 plays task 1, like ref
            assert out[0].text == out[2].text


def test_expert_plan_on_request_only(games):
    with EnvPool(ALFWORLD, games, num_workers=1, step_timeout=60) as pool:
        (obs,) = pool.reset([0])
        assert obs.expert_plan is None
        (obs,) = pool.reset([0], expert=True)
        plan = obs.expert_plan
        for k, action in enumerate(plan):
            obs = pool.step({0: action})[0]
            assert obs.expert_plan == plan[k + 1 :] or (obs.done and obs.won)
        assert obs.won and obs.done and obs.reward == 10.0
        again = pool.step({0: "look"})[0]  # finished episodes stay finished
        assert again.done and again.reward == 0.0 and again.text == obs.text


def test_64_envs_survive_a_killed_worker(games):
    n = 64
    with EnvPool(ALFWORLD, games, num_workers=4, step_timeout=60) as pool:
        assert not any(p["jax_imported"] for p in pool.probe())
        resets = pool.reset([0] * n)
        assert all(not obs.failed for obs in resets)
        first = pool.step({i: "look" for i in range(n)})
        assert all(not first[i].failed for i in range(n))
        victim = 1
        os.kill(pool.worker_pids[victim], signal.SIGKILL)  # mid-episode
        out = pool.step({i: "inventory" for i in range(n)})
        for i in range(n):
            obs = out[i]
            if i % 4 == victim:
                assert obs.failed and obs.done and obs.reward == 0.0 and not obs.won
            else:
                assert not obs.failed and not obs.done and obs.text == "You are not carrying anything."
        assert pool.restarts == 1
        out = pool.step({i: "look" for i in range(n)})  # the lost episodes stay failed, others go on
        assert all(out[i].failed == (i % 4 == victim) for i in range(n))
        resets = pool.reset([1] * n)  # after a reset every slot plays again
        assert all(not obs.failed and obs.info["goal"] == games.goals[1] for obs in resets)
        assert all(not r.failed for r in pool.step({i: "look" for i in range(n)}).values())
        assert not any(p["jax_imported"] for p in pool.probe())


def test_hung_worker_times_out_and_is_replaced(games):
    with EnvPool(ALFWORLD, games, num_workers=2, step_timeout=3.0) as pool:
        pool.reset([0, 0, 0, 0])
        hung = pool.worker_pids[0]
        os.kill(hung, signal.SIGSTOP)
        start = time.monotonic()
        out = pool.step({i: "look" for i in range(4)})
        assert time.monotonic() - start < 15
        assert [out[i].failed for i in range(4)] == [True, False, True, False]
        assert "step_timeout" in out[0].info["error"]
        assert pool.worker_pids[0] != hung
        assert all(not obs.failed for obs in pool.reset([1, 1, 1, 1]))


def test_bad_input(games):
    with EnvPool(ALFWORLD, games, num_workers=1, step_timeout=60) as pool:
        with pytest.raises(ValueError, match="out of range"):
            pool.reset([len(games)])
        with pytest.raises(ValueError, match="never reset"):
            pool.step({0: "look"})
    with pytest.raises(ValueError):
        EnvPool(ALFWORLD, games, num_workers=0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset([0])
