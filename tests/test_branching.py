"""Rollouts that branch at a chosen step (`rollout.branch_at`, `rollout.branch_openers`) on search QA,
played in this process: before the branch step a task group's followers replay its leader's answers
(no generation), at it every slot samples (each starting with the family's action opener of its branch),
forced opener tokens carry no loss unless trained (then the sampler scores them, and its log-probs are
the update's old ones), and branch_at=0 is the plain rollout."""

import dataclasses
import random

import jax
import numpy as np
import pytest
from conftest import load_config
from flax import nnx

from roleagent_jax.backends.base import FoldedCalls
from roleagent_jax.backends.jax import JaxBackend
from roleagent_jax.config import CONFIG, validate
from roleagent_jax.envs import get_family
from roleagent_jax.envs.search_qa.parser import parse_turn
from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM
from roleagent_jax.models.tokenizer import PromptEncoder, train_bpe_tokenizer
from roleagent_jax.rl.logprobs import make_logprob_fn
from roleagent_jax.rl.ppo import pack_rows, ppo_batch
from roleagent_jax.run.branching import branch_slots, last_slots
from roleagent_jax.run.metrics import branch_success, iteration_metrics
from roleagent_jax.run.rollout import collect
from roleagent_jax.sampling import Sampler, SampleResult, SamplingParams
from roleagent_jax.types import RolloutSettings

FAMILY = get_family("search_qa").configured({"prompt": "compact"})
DEFAULTS = RolloutSettings.from_config(CONFIG.build())
TASKS = GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]  # two questions, four rollouts each


class LocalPool:
    """The family's envs in this process, one per slot (what `EnvPool` runs in worker processes)."""

    def __init__(self, pool, max_steps: int):
        self.pool, self.max_steps = pool, max_steps

    def reset(self, task_ids, expert=False):
        self.envs = [FAMILY.make_env(self.max_steps) for _ in task_ids]
        return [env.reset(self.pool[t], expert=expert) for env, t in zip(self.envs, task_ids)]

    def step(self, actions):
        return {i: self.envs[i].step(a) for i, a in actions.items()}


class Scripted:
    """A model that searches with a random query, and closes a block a forced opener started; it scores
    every forced token -0.5 and generates nothing when asked for no token."""

    def __init__(self, tok):
        self.tok, self.rng, self.calls = tok, random.Random(0), []
        self.openers = {o: tok.encode(o, add_special_tokens=False) for o in FAMILY.action_openers}

    def __call__(self, requests):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            scores = [-0.5] * r.score_tokens
            if not r.max_new_tokens:
                out.append(SampleResult([], [], "", "length", r.role, scores))
                continue
            text = f"<search>q{self.rng.randrange(1000)}</search>"
            for opener, ids in self.openers.items():
                if r.prompt_ids[-len(ids) :] == ids:
                    text = f"q{self.rng.randrange(1000)}</search>" if "search" in opener else "Paris</answer>"
            ids = self.tok.encode(text, add_special_tokens=False)
            out.append(
                SampleResult(ids, [-0.1 * (k + 1) for k in range(len(ids))], text, "stop", r.role, scores)
            )
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pool = FAMILY.task_pool("gen_train", n=2, seed=0)
    texts = [FAMILY.agent_prompt(t.goal, [], f"Question: {t.goal}", None, 0, 2) for t in pool.tasks]
    tok = train_bpe_tokenizer((texts + ["<search>q12</search> <answer>Paris</answer>"]) * 20, 400,
                              tmp_path_factory.mktemp("tok"))  # fmt: skip
    return pool, tok


def settings(**changes):
    return dataclasses.replace(DEFAULTS, max_steps=3, max_prompt_tokens=512, max_response_tokens=8,
                               wia_mode="off", **changes)  # fmt: skip


def play(world, generate, envs=None, **changes):
    pool, tok = world
    return collect(generate, FAMILY, envs or LocalPool(pool, 3), TASKS, GROUPS, tok, settings(**changes))


def at(result, step):
    """The rows of one step, by trajectory."""
    return {r.traj_id: r for r in result.rows if r.step_index == step}


def random_model(tok, seed: int):
    """A random one-layer model of the tokenizer's vocabulary: its config, graphdef and params."""
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)  # fmt: skip
    return (cfg, *nnx.split(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(seed))))


def random_sampler(tok, seed: int):
    """A random one-layer model on the real sampler: its graphdef, its params and a `generate` that
    draws each call's key from ``seed``."""
    cfg, graphdef, params = random_model(tok, seed)
    sampler = Sampler(graphdef, cfg, tok, eos_ids=(), prompt_buckets=(128, 256, 512), max_new_tokens_cap=8)
    keys = iter(jax.random.split(jax.random.key(seed), 8))

    def generate(requests):
        return sampler.generate(params, requests, SamplingParams(), next(keys))

    return graphdef, params, generate


def test_each_slot_knows_its_leader_and_branch():
    assert branch_slots([0, 0, None, 1, 0, 1]) == [(0, 0), (0, 1), (2, 0), (3, 0), (0, 2), (3, 1)]


def test_followers_replay_the_leader_and_branches_open_each_action_kind(world):
    _, tok = world
    model = Scripted(tok)
    result = play(world, model, branch_at=1, branch_openers=True)
    assert [len(c) for c in model.calls[:2]] == [2, 8]  # step 0: one request per group, step 1: all
    assert result.stats["replayed_answers"] == 6
    first, branched = at(result, 0), at(result, 1)
    for slot in range(8):
        leader = first[slot - slot % 4]
        same = (
            first[slot].prompt_ids,
            first[slot].response_ids,
            first[slot].logprobs,
            first[slot].forced_tokens,
        )
        assert same == (leader.prompt_ids, leader.response_ids, leader.logprobs, 0)
    openers = [tok.encode(o, add_special_tokens=False) for o in FAMILY.action_openers]
    for slot, request in enumerate(model.calls[1]):
        row, opener = branched[slot], openers[slot % 2]
        assert request.group == slot // 4 and request.prompt_ids == row.prompt_ids + opener
        assert request.max_new_tokens == 8 - len(opener)
        assert row.response_ids[: len(opener)] == opener and row.forced_tokens == len(opener)
        assert row.logprobs[: len(opener)] == [0.0] * len(opener)
    for g in (0, 1):
        rows = [branched[s] for s in range(4 * g, 4 * g + 4)]
        assert len({r.anchor_hash for r in rows}) == 1 and len({r.state for r in rows}) == 1
    kinds = [parse_turn(t.steps[1].response).kind for t in result.trajectories]
    assert kinds == ["search", "answer"] * 4  # every step group compares searching again with answering
    assert all(r.forced_tokens == 0 for r in at(result, 2).values())  # only the branch step is forced
    rates = branch_success(result.stats)  # each opener's branches: 4 episodes, its own wins
    for i, opener in enumerate(FAMILY.action_openers):
        mine = result.trajectories[i::2]
        assert result.stats[f"branch_episodes/{opener}/all"] == 4
        assert rates[f"rollout/branch_success/{opener}/all"] == sum(t.won for t in mine) / 4
        for kind in {t.task_type for t in mine}:
            same = [t.won for t in mine if t.task_type == kind]
            assert rates[f"rollout/branch_success/{opener}/{kind}"] == sum(same) / len(same)


def test_the_expert_branch_plays_the_experts_step_and_the_others_sample(world):
    """`expert_branch`: each group's last slot plays the expert's next action at the branch step, whole and
    forced (no request), while the other branches still start with the openers in turn."""
    pool, tok = world
    model = Scripted(tok)
    result = play(world, model, branch_at=1, branch_openers=True, expert_branch=True)
    assert [len(c) for c in model.calls[:2]] == [2, 6]  # the two expert branches ask for nothing
    branched = at(result, 1)
    env = FAMILY.make_env(3)
    for slot, row in branched.items():
        if slot % 4 != 3:
            assert row.forced_tokens < len(row.response_ids)  # an opener, then sampled tokens
            continue
        env.reset(pool[TASKS[slot]], expert=True)
        obs = env.step(result.trajectories[slot].steps[0].response)
        action = obs.expert_plan[0]
        assert result.trajectories[slot].steps[1].response == action
        assert row.response_ids == tok.encode(action, add_special_tokens=False)
        assert row.forced_tokens == len(row.response_ids) and row.logprobs == [0.0] * len(row.response_ids)
    assert result.stats["branch_episodes/expert/all"] == 2
    assert result.stats["branch_episodes/<search>/all"] + result.stats["branch_episodes/<answer>/all"] == 6

    # trained, the forced tokens are scored: the expert's step in a request that generates nothing
    model = Scripted(tok)
    trained = play(world, model, branch_at=1, branch_openers=True, expert_branch=True, train_openers=True)
    assert [len(c) for c in model.calls[:2]] == [2, 8]
    for slot, request in enumerate(model.calls[1]):
        row = at(trained, 1)[slot]
        assert request.prompt_ids == row.prompt_ids + row.response_ids[: row.forced_tokens]
        assert request.score_tokens == row.forced_tokens and row.forced_scored
        assert row.logprobs[: row.forced_tokens] == [-0.5] * row.forced_tokens
        if slot % 4 == 3:
            assert request.max_new_tokens == 0 and row.response_ids == at(result, 1)[slot].response_ids
    assert not any(r.forced_scored for r in at(trained, 0).values())


def test_a_follower_whose_observation_differs_samples_on_its_own(world):
    pool, tok = world

    class Drifting(LocalPool):
        def step(self, actions):
            out = super().step(actions)
            if 1 in out:
                out[1] = dataclasses.replace(out[1], text=out[1].text + " (again)")
            return out

    model = Scripted(tok)
    result = play(world, model, Drifting(pool, 3), branch_at=2)
    assert [len(c) for c in model.calls] == [2, 3, 8]  # step 1: the leaders and slot 1
    assert result.stats["replayed_answers"] == 6 + 5
    assert at(result, 1)[2].response_ids == at(result, 1)[0].response_ids != at(result, 1)[1].response_ids


def test_branch_at_zero_is_the_plain_rollout(world):
    _, tok = world
    model = Scripted(tok)
    result = play(world, model)
    encode = PromptEncoder(tok, 512)
    assert result.stats["replayed_answers"] == 0 and len(model.calls) == 3
    for step, requests in enumerate(model.calls):
        rows = list(at(result, step).values())
        assert len(requests) == len(rows)  # one request per slot still playing
        for request, row in zip(requests, rows):
            traj = result.trajectories[row.traj_id]
            prompt = FAMILY.agent_prompt(traj.goal, [(s.observation, s.action) for s in traj.steps[:step]],
                                         traj.steps[step].observation, None, step, DEFAULTS.history_k)  # fmt: skip
            assert request.prompt_ids == row.prompt_ids == encode(prompt)
            assert request.max_new_tokens == 8 and request.group == row.group_id
            assert row.forced_tokens == 0


def test_branches_keep_the_policys_log_probs_and_forced_tokens_weigh_nothing(world):
    """A random model on the real sampler: each row's sampled log-probs are the training forward's of its
    prompt, forced opener and sampled tokens, and the packed batch leaves the opener out of the loss."""
    _, tok = world
    graphdef, params, generate = random_sampler(tok, 0)

    result = play(world, generate, branch_at=1, branch_openers=True)
    first, branched = at(result, 0), at(result, 1)
    assert all(first[s].response_ids == first[s - s % 4].response_ids for s in range(8))
    assert all(first[s].logprobs == first[s - s % 4].logprobs for s in range(8))
    assert len({tuple(r.response_ids) for r in branched.values()}) == 8
    openers = {len(tok.encode(o, add_special_tokens=False)) for o in FAMILY.action_openers}
    assert {r.forced_tokens for r in branched.values()} == openers

    rows = result.rows
    packed = ppo_batch(rows, np.zeros(len(rows), np.float32), pad_id=tok.pad_token_id, max_prompt=512,
                       max_response=8, mini_batch_rows=len(rows),
                       old_logprobs=lambda batch: np.asarray(make_logprob_fn(graphdef)(params, batch)))  # fmt: skip
    sampled = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows], tok.pad_token_id,
                        response_logprobs=[r.logprobs for r in rows],
                        forced_tokens=[r.forced_tokens for r in rows])["sampler_logprobs"]  # fmt: skip
    np.testing.assert_allclose(packed["old_logprobs"], sampled, atol=1e-4)
    start = max(len(r.prompt_ids) for r in rows)  # where every response begins on the grid
    for i, r in enumerate(rows):
        weights = packed["loss_mask"][i, start : start + len(r.response_ids)]
        assert weights.tolist() == [0.0] * r.forced_tokens + [1.0] * (len(r.response_ids) - r.forced_tokens)
        assert not packed["old_logprobs"][i, start : start + r.forced_tokens].any()

    # train_openers: the opener is in the loss, its old log-prob the policy's own (the training forward of
    # the same rows with no token left out), the sampled tokens' as before
    trained = ppo_batch(rows, np.zeros(len(rows), np.float32), pad_id=tok.pad_token_id, max_prompt=512,
                        max_response=8, mini_batch_rows=len(rows), train_forced=True,
                        old_logprobs=lambda batch: np.asarray(make_logprob_fn(graphdef)(params, batch)))  # fmt: skip
    whole = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows], tok.pad_token_id)
    np.testing.assert_array_equal(trained["loss_mask"], whole["loss_mask"])
    for i, r in enumerate(rows):
        span = slice(start, start + len(r.response_ids))
        forced = slice(start, start + r.forced_tokens)
        np.testing.assert_allclose(trained["old_logprobs"][i, span][r.forced_tokens :],
                                   packed["old_logprobs"][i, span][r.forced_tokens :], atol=1e-5)  # fmt: skip
        assert (trained["old_logprobs"][i, forced] < 0).all()
    with pytest.raises(ValueError, match="train_forced needs old_logprobs"):
        ppo_batch(rows, np.zeros(len(rows), np.float32), pad_id=tok.pad_token_id, max_prompt=512,
                  max_response=8, mini_batch_rows=len(rows), train_forced=True)  # fmt: skip


def test_trained_forced_tokens_take_their_old_log_probs_from_the_sampler(world):
    """`train_openers` with the real sampler on a random model: the forced openers and the expert's whole
    step are scored in the sampler's prefill, so the update's inputs built from the rollout's own
    log-probs (`train.old_logprobs=sampler`, no log-prob pass) equal those of the recompute pass."""
    _, tok = world
    graphdef, params, generate = random_sampler(tok, 1)

    rows = play(
        world, generate, branch_at=1, branch_openers=True, expert_branch=True, train_openers=True
    ).rows
    forced = [r for r in rows if r.forced_tokens]
    assert len(forced) == 8 and sum(r.forced_tokens == len(r.response_ids) for r in forced) == 2  # 2 experts

    def batch(old_logprobs):
        return ppo_batch(rows, np.zeros(len(rows), np.float32), pad_id=tok.pad_token_id, max_prompt=512,
                         max_response=64, mini_batch_rows=len(rows), train_forced=True,
                         old_logprobs=old_logprobs)  # fmt: skip

    own = batch(None)
    recomputed = batch(lambda b: np.asarray(make_logprob_fn(graphdef)(params, b)))
    assert own.keys() == recomputed.keys()
    for key in own:
        np.testing.assert_allclose(own[key], recomputed[key], atol=1e-4, rtol=0, err_msg=key)
    start = max(len(r.prompt_ids) for r in rows)
    for i, r in enumerate(rows):
        assert (own["old_logprobs"][i, start : start + r.forced_tokens] < 0).all()


def test_branching_that_cannot_work_is_refused_at_start_up():
    c = load_config("base")  # ALFWorld: no action openers
    c.rollout.branch_openers = True
    c.rollout.branch_at = c.env.max_steps
    with pytest.raises(ValueError) as err:
        validate(c)
    assert "--config.rollout.branch_openers=True: env.name='alfworld' declares no action openers" in str(
        err.value
    )
    assert f"--config.rollout.branch_at={c.env.max_steps}: must be below env.max_steps" in str(err.value)
    qa = load_config("search_qa_demo")
    qa.model.path, qa.model.required = "", False
    qa.rollout.branch_at, qa.rollout.branch_openers = 1, True
    validate(qa)
    for old in ("recompute", "sampler"):  # the sampler scores the forced openers it is given
        qa.rollout.train_openers, qa.train.old_logprobs = True, old
        validate(qa)
    qa.rollout.branch_openers = False
    with pytest.raises(ValueError) as err:
        validate(qa)
    assert (
        "--config.rollout.train_openers=True: needs rollout.branch_openers or rollout.expert_branch"
        in str(err.value)
    )


def test_branch_success_is_each_openers_wins_over_its_episodes():
    """The scripted episodes above never win, so the rate itself is checked here on counts that do."""
    stats = {"branch_episodes/<search>/bridge": 4, "branch_wins/<search>/bridge": 3,
             "branch_episodes/expert/all": 2, "branch_wins/expert/all": 2, "sampler_calls": 5}  # fmt: skip
    assert branch_success(stats) == {
        "rollout/branch_success/<search>/bridge": 0.75,
        "rollout/branch_success/expert/all": 1.0,
    }


def test_expert_slots_puts_the_experts_step_in_each_groups_last_k_branches(world):
    """`expert_slots` = 2, `expert_when="always"`: the last two slots of every group play the expert's
    step at the branch step (its tokens marked as the expert's), the others their own answers."""
    _, tok = world
    model = Scripted(tok)
    result = play(world, model, branch_at=1, expert_branch=True, expert_slots=2, expert_when="always")
    assert [len(c) for c in model.calls[:2]] == [2, 4]
    for slot, row in at(result, 1).items():
        expert = slot % 4 >= 2
        assert row.expert_tokens == (len(row.response_ids) if expert else 0)
        assert row.forced_tokens == row.expert_tokens
    assert all(r.expert_tokens == 0 for r in result.rows if r.step_index != 1)
    assert result.stats["branch_episodes/expert/all"] == 4 and result.stats["expert_replays"] == 0
    assert last_slots(branch_slots([0, 0, 0, None, 1, 1]), 2) == [1, 2, 5]


def test_no_win_replays_only_groups_without_a_win_from_the_shared_prefix_with_the_experts_step(world):
    """`expert_when="no_win"`: the groups play their own branches first (no expert); a group none of
    whose episodes won plays its last k slots again: the leader's prefix replayed (no request), the
    expert's step at the branch step, its own samples after; those episodes replace the first ones."""
    pool, tok = world

    class WinsGroupOne(LocalPool):  # the second question's episodes win at their first step
        def step(self, actions):
            out = super().step(actions)
            return {i: dataclasses.replace(o, won=True) if self.won_task[i] else o for i, o in out.items()}

        def reset(self, task_ids, expert=False):
            self.won_task = [t == 1 and len(task_ids) == 8 for t in task_ids]
            return super().reset(task_ids, expert)

    model = Scripted(tok)
    result = play(world, model, WinsGroupOne(pool, 3), branch_at=1, branch_openers=True, expert_branch=True,
                  expert_slots=2, expert_when="no_win")  # fmt: skip
    assert result.stats["expert_replays"] == 2  # group 0 only, its last two slots
    first_pass = [len(c) for c in model.calls[:3]]
    assert first_pass == [2, 8, 4]  # no expert in the first pass; group 1's episodes ended at step 1
    again = model.calls[3:]
    assert sum(len(c) for c in again) == 2  # step 0 replayed, step 1 the expert's: only step 2 samples
    assert [t.traj_id for t in result.trajectories] == list(range(8))
    rows = {(r.traj_id, r.step_index): r for r in result.rows}
    assert len(rows) == len(result.rows)  # each replaced episode's rows are gone, its replay's are in
    env = FAMILY.make_env(3)
    for slot in (2, 3):
        leader = rows[(0, 0)]
        assert (rows[(slot, 0)].response_ids, rows[(slot, 0)].logprobs) == (
            leader.response_ids,
            leader.logprobs,
        )
        env.reset(pool[TASKS[slot]], expert=True)
        action = env.step(result.trajectories[slot].steps[0].response).expert_plan[0]
        expert = rows[(slot, 1)]
        assert result.trajectories[slot].steps[1].response == action
        assert expert.response_ids == tok.encode(action, add_special_tokens=False)
        assert expert.expert_tokens == expert.forced_tokens == len(expert.response_ids)
    assert all(r.expert_tokens == 0 for (t, _), r in rows.items() if t not in (2, 3))
    assert result.stats["branch_episodes/expert/all"] == 2
    assert result.stats["branch_episodes/<search>/all"] + result.stats["branch_episodes/<answer>/all"] == 6
    assert sorted(t.won for t in result.trajectories) == [False] * 4 + [True] * 4
    assert [kind for kind, _ in result.branch_prompts] == [pool[0].type, pool[1].type]


def test_an_iteration_logs_the_samplers_prefill_and_decode_seconds_within_generation(world):
    """A rollout through the jax backend: the iteration's metrics carry `time/generate/prefill` and
    `/decode`, together at most `time/generate`, and the programs compiled; a backend that keeps no
    stats (here a plain function) logs neither."""
    _, tok = world
    cfg, graphdef, params = random_model(tok, 0)
    backend = JaxBackend(graphdef, cfg, tok, eos_ids=())
    backend.update_weights(params)
    result = play(world, FoldedCalls(backend, SamplingParams(), jax.random.key(0)))
    metrics = iteration_metrics({}, result, result.rows, np.zeros(len(result.rows)), FAMILY.task_types, {})
    prefill, decode = metrics["time/generate/prefill"], metrics["time/generate/decode"]
    assert prefill >= 0 and decode >= 0 and prefill + decode <= metrics["time/generate"]
    assert metrics["rollout/compilations"] == backend.sampler.num_compilations > 0
    plain = play(world, Scripted(tok))
    metrics = iteration_metrics({}, plain, plain.rows, np.zeros(len(plain.rows)), FAMILY.task_types, {})
    assert not [k for k in metrics if k.startswith("time/generate/") or k == "rollout/compilations"]
