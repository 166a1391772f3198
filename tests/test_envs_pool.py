"""The worker pool: parallel slots, exact resets, crash and hang recovery, no JAX in workers."""

import os
import signal
import time

import jax  # noqa: F401  (the parent holds JAX; the workers must not)
import pytest

from roleagent_jax.envs import AlfWorldEnv, EnvPool, TaskPool


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> TaskPool:
    return TaskPool.generated(
        tmp_path_factory.mktemp("pool_games"), n=2, seed=7, pool="seen", num_receptacles=4
    )


def test_pool_matches_single_process_env(games):
    """Same game, same actions: the pool's answers equal an in-process AlfWorldEnv's."""
    ref = AlfWorldEnv(max_steps=50)
    with EnvPool(games, num_workers=2, step_timeout=60) as pool:
        resets = pool.reset([1, 0, 1])
        for slot, task in enumerate([1, 0, 1]):
            obs, info = ref.reset(games.game_files[task])
            assert resets[slot] == (obs, info)
        for k in range(3):
            actions = {s: resets[s][1]["admissible_commands"][k] for s in range(3)}
            out = pool.step(actions)
            obs, reward, done, info = ref.step(actions[2])  # slot 2 plays task 1, like ref
            assert out[2] == (obs, reward, done, info)
            assert out[0][0] == out[2][0]


def test_expert_plan_on_request_only(games):
    with EnvPool(games, num_workers=1, step_timeout=60) as pool:
        ((obs, info),) = pool.reset([0])
        assert "expert_plan" not in info
        ((obs, info),) = pool.reset([0], expert=True)
        plan = info["expert_plan"]
        for k, action in enumerate(plan):
            obs, reward, done, info = pool.step({0: action})[0]
            assert info["expert_plan"] == plan[k + 1 :] or (done and info["won"])
        assert info["won"] and done and reward == 10.0
        obs2, reward2, done2, _ = pool.step({0: "look"})[0]  # finished episodes stay finished
        assert done2 and reward2 == 0.0 and obs2 == obs


def test_64_envs_survive_a_killed_worker(games):
    n = 64
    with EnvPool(games, num_workers=4, step_timeout=60) as pool:
        assert not any(p["jax_imported"] for p in pool.probe())
        resets = pool.reset([0] * n)
        assert all(not info["env_failed"] for _, info in resets)
        first = pool.step({i: "look" for i in range(n)})
        assert all(not first[i][3]["env_failed"] for i in range(n))
        victim = 1
        os.kill(pool.worker_pids[victim], signal.SIGKILL)  # mid-episode
        out = pool.step({i: "inventory" for i in range(n)})
        for i in range(n):
            obs, reward, done, info = out[i]
            if i % 4 == victim:
                assert info["env_failed"] and done and reward == 0.0 and info["goal"] == games.goals[0]
            else:
                assert not info["env_failed"] and not done and obs == "You are not carrying anything."
        assert pool.restarts == 1
        out = pool.step({i: "look" for i in range(n)})  # the lost episodes stay failed, others go on
        assert all(out[i][3]["env_failed"] == (i % 4 == victim) for i in range(n))
        resets = pool.reset([1] * n)  # after a reset every slot plays again
        assert all(not info["env_failed"] and info["goal"] == games.goals[1] for _, info in resets)
        assert all(not r[3]["env_failed"] for r in pool.step({i: "look" for i in range(n)}).values())
        assert not any(p["jax_imported"] for p in pool.probe())


def test_hung_worker_times_out_and_is_replaced(games):
    with EnvPool(games, num_workers=2, step_timeout=3.0) as pool:
        pool.reset([0, 0, 0, 0])
        hung = pool.worker_pids[0]
        os.kill(hung, signal.SIGSTOP)
        start = time.monotonic()
        out = pool.step({i: "look" for i in range(4)})
        assert time.monotonic() - start < 15
        assert [out[i][3]["env_failed"] for i in range(4)] == [True, False, True, False]
        assert "step_timeout" in out[0][3]["error"]
        assert pool.worker_pids[0] != hung
        assert all(not info["env_failed"] for _, info in pool.reset([1, 1, 1, 1]))


def test_bad_input(games):
    with EnvPool(games, num_workers=1, step_timeout=60) as pool:
        with pytest.raises(ValueError, match="out of range"):
            pool.reset([len(games)])
        with pytest.raises(ValueError, match="never reset"):
            pool.step({0: "look"})
    with pytest.raises(ValueError):
        EnvPool(games, num_workers=0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset([0])
