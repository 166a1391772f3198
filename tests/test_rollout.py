"""Rollouts on the real engine with a scripted model: lockstep batching, WIA in the same sampler call."""

import dataclasses

import numpy as np
import pytest

from roleagent_jax import wia
from roleagent_jax.config import CONFIG
from roleagent_jax.envs import EnvPool, get_family
from roleagent_jax.models.tokenizer import PromptEncoder, train_bpe_tokenizer
from roleagent_jax.run.rollout import RolloutSettings, collect
from roleagent_jax.sampling import SampleRequest, SampleResult
from roleagent_jax.wia import wia_multipliers
from roleagent_jax.wia.predictor import Predictor

ALFWORLD = get_family("alfworld")

# The declared defaults (the config keys) that each test changes.
DEFAULTS = RolloutSettings.from_config(CONFIG.build())


class SpyPool:
    """Forwards to a real EnvPool and remembers each slot's latest observation and the last step's."""

    def __init__(self, envs):
        self.envs, self.pool, self.info, self.last_outcomes = envs, envs.pool, {}, {}

    def reset(self, task_ids):
        out = self.envs.reset(task_ids)
        self.info = dict(enumerate(out))
        return out

    def step(self, actions):
        out = self.envs.step(actions)
        self.last_outcomes = out
        self.info.update(out)
        return out


class ScriptedModel:
    """Agent rows follow the expert plan; predictor rows answer with the observation that really came."""

    def __init__(self, spy, perfect_predictor=True):
        self.spy, self.perfect, self.calls, self.mixed_calls, self.expected_slots = (
            spy,
            perfect_predictor,
            0,
            0,
            [],
        )
        self.seen: list[tuple[SampleRequest, int]] = []  # (request, the slot it serves)

    def __call__(self, requests):
        self.calls += 1
        roles = [r.role for r in requests]
        assert roles == sorted(roles), "agent requests come first, then predictor requests"
        self.mixed_calls += "agent" in roles and "predictor" in roles
        agent_slots = [s for s in sorted(self.spy.info) if s in self.expected_slots]
        predicted_slots = sorted(self.spy.last_outcomes)
        predicted = [self.spy.last_outcomes[s] for s in predicted_slots]
        out, k = [], 0
        for r in requests:
            if r.role == "agent":
                plan = self.spy.info[agent_slots[k]].expert_plan or ["look"]
                text = f"<think>follow the plan</think><action>{plan[0]}</action>"
                self.seen.append((r, agent_slots[k]))
                k += 1
            else:
                obs = predicted.pop(0).text
                self.seen.append((r, predicted_slots.pop(0)))
                text = wia.format_predictions([obs if self.perfect else "a banana 7"])
            out.append(SampleResult([1, 2, 3], [-0.5, -0.5, -0.5], text, "stop", r.role))
        return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    pool = ALFWORLD.task_pool(
        "gen_seen", gen_dir=root / "games", n=4, seed=3, options={"num_receptacles": 4, "num_objects": 2}
    )
    tok = train_bpe_tokenizer(
        ["You arrive at cabinet 1. <action>go to fridge 1</action>"] * 10, 300, root / "tok"
    )
    envs = EnvPool(ALFWORLD, pool, num_workers=2, max_steps=20, expert=True)
    yield pool, tok, envs
    envs.close()


def run(setup, mode, perfect=True):
    pool, tok, envs = setup
    spy = SpyPool(envs)
    model = ScriptedModel(spy, perfect)

    def generate(requests):
        model.expected_slots = [i for i in range(8) if i not in done_slots]
        return model(requests)

    done_slots: set[int] = set()
    original_step = spy.step

    def step(actions):
        out = original_step(actions)
        done_slots.update(i for i, o in out.items() if o.done)
        return out

    spy.step = step
    settings = dataclasses.replace(
        DEFAULTS,
        max_steps=20,
        history_k=2,
        max_prompt_tokens=4096,
        max_response_tokens=32,
        wia_mode=mode,
        wia_horizon=1,
        wia_fraction=1.0,
    )
    task_ids = [0, 0, 1, 1, 2, 2, 3, 3]
    result = collect(generate, ALFWORLD, spy, task_ids, [0, 0, 1, 1, 2, 2, 3, 3], tok, settings)
    return result, model


def test_lockstep_rollout_follows_expert_and_wins(setup):
    result, model = run(setup, "off")
    assert all(t.won for t in result.trajectories)
    longest = max(len(t.steps) for t in result.trajectories)
    assert model.calls == longest  # one batched call per step; finished envs leave the batch
    assert len(result.rows) == sum(len(t.steps) for t in result.trajectories)
    for r in result.rows:
        traj = result.trajectories[r.traj_id]
        assert traj.steps[r.step_index].reward == r.reward and r.valid
    # Two rollouts of the same task see the same first observation: same anchor, same group.
    first = {(r.traj_id): r.anchor_hash for r in result.rows if r.step_index == 0}
    assert first[0] == first[1] and first[0] != first[2]


def test_separate_mode_shares_one_call_per_step_and_perfect_predictions_score_one(setup):
    result, model = run(setup, "separate")
    longest = max(len(t.steps) for t in result.trajectories)
    assert model.calls == longest + 1  # the last actions' predictions need one final call
    assert model.mixed_calls == longest - 1  # every other call carries both roles together
    mult, metrics = wia_multipliers(
        result.trajectories, result.predictions, result.rows, 1.0, "rapidfuzz", "none"
    )
    np.testing.assert_allclose(mult, 2.0)  # R_pre = 1 on every scored step
    assert metrics["wia/parse_rate"] == 1.0 and metrics["wia/lms_h1"] == 1.0


def test_rollout_declares_task_groups_and_caps_predictions_by_observation_length(setup):
    _, tok, _ = setup
    result, model = run(setup, "separate")
    assert {r.role for r, _ in model.seen} == {"agent", "predictor"}
    for request, slot in model.seen:
        assert request.group == slot // 2  # both roles share within the slot's task group
    budgets = [r.max_new_tokens for r, _ in model.seen if r.role == "predictor"]
    assert budgets == sorted(budgets) and max(budgets) <= 128  # grows with what was seen, capped
    first = result.trajectories[0].steps[0].observation
    framed = len(tok.encode(wia.format_predictions([" ".join(first.split())]), add_special_tokens=False))
    assert budgets[0] >= min(128, framed)  # room for a prediction as long as an observation seen


def test_a_paused_prediction_continues_in_the_next_call_and_parses_whole(setup):
    _, tok, _ = setup
    predictor = Predictor(
        ALFWORLD,
        PromptEncoder(tok, 4096),
        dataclasses.replace(DEFAULTS, wia_mode="separate", wia_horizon=1),
        0,
        0,
    )
    answer = tok.encode(wia.format_predictions(["You arrive at fridge 1."]), add_special_tokens=False)
    first = SampleRequest([5, 6, 7], 40, stop=(wia.PREDICT_STOP,), role="predictor", background=True)
    predictor.pending = [(3, 0, first, None)]
    predictions = {3: {}}
    predictor.receive([SampleResult(answer[:4], [-0.1] * 4, "", "paused", "predictor")], predictions)
    (more,) = predictor.requests()
    assert more.prompt_ids == [5, 6, 7] + answer[:4] and more.max_new_tokens == 36 and not predictions[3]
    rest = SampleResult(answer[4:], [-0.1] * (len(answer) - 4), "", "stop", "predictor")
    predictor.receive([rest], predictions)
    assert predictions[3][0] == ["You arrive at fridge 1."] and not predictor.requests()
    ((traj, step, prompt, whole),) = predictor.samples  # one training row over both calls
    assert (traj, step, prompt, whole.token_ids) == (3, 0, [5, 6, 7], answer)
    assert len(whole.logprobs) == len(answer)


def test_evaluation_style_rollouts_declare_no_groups(setup):
    pool, tok, envs = setup
    seen = []

    def generate(requests):
        seen.extend(requests)
        return [SampleResult([1], [-0.1], "<action>look</action>", "stop", r.role) for r in requests]

    collect(
        generate,
        ALFWORLD,
        envs,
        [0, 1, 2, 3],
        [0, 1, 2, 3],
        tok,
        dataclasses.replace(DEFAULTS, max_steps=2, wia_mode="off", wia_horizon=1),
    )
    assert seen and all(r.group is None for r in seen)


def test_wrong_predictions_score_low(setup):
    result, _ = run(setup, "separate", perfect=False)
    mult, metrics = wia_multipliers(
        result.trajectories, result.predictions, result.rows, 1.0, "rapidfuzz", "none"
    )
    assert metrics["wia/lms_h1"] < 0.3 and np.all(mult < 1.3)


def test_predictor_prompt_gets_history_k_pairs(setup, monkeypatch):
    """The predictor sees the same `history_k` (action, observation) pairs as the agent, not one."""
    seen = []
    original = ALFWORLD.predictor_prompt

    def recording(goal, history, observation, action, horizon):
        seen.append(list(history))
        return original(goal, history, observation, action, horizon)

    monkeypatch.setattr(ALFWORLD, "predictor_prompt", recording)
    result, _ = run(setup, "separate")
    assert max(len(t.steps) for t in result.trajectories) >= 3
    assert max(len(h) for h in seen) == 2 and {len(h) for h in seen} == {0, 1, 2}
    assert all(isinstance(a, str) and isinstance(o, str) for h in seen for a, o in h)


def test_merged_shares_join_lists_add_counts_and_keep_the_slowest_time():
    """The processes' shares of one rollout become one result: what each played, in process order; counts
    add up; times overlapped, so the slowest process's is the iteration's."""
    from roleagent_jax.run.rollout import RolloutResult

    a = RolloutResult(["t0"], ["r0"], {0: {0: ["x"]}}, {"sampler_calls": 3, "time_env": 2.0}, ["s0"])
    b = RolloutResult(["t1", "t2"], ["r1"], {1: {}}, {"sampler_calls": 3, "time_env": 5.0}, [])
    merged = RolloutResult.merge([a, b])
    assert (merged.trajectories, merged.rows, merged.predictor_samples) == (
        ["t0", "t1", "t2"],
        ["r0", "r1"],
        ["s0"],
    )
    assert merged.predictions == {0: {0: ["x"]}, 1: {}}
    assert merged.stats == {"sampler_calls": 6, "time_env": 5.0}
