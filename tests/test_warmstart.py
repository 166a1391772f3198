"""Warm-start data: expert play with DAgger-style detours, labelled by the engine's replanned expert."""

import dataclasses
import re

import numpy as np
import pytest

from roleagent_jax.envs import EnvPool, TaskPool, get_family
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv
from roleagent_jax.run.warmstart import (
    examples_from_episodes,
    expert_episodes,
    length_grouped_batches,
    target_ids,
)

ALFWORLD = get_family("alfworld")


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> TaskPool:
    return ALFWORLD.task_pool("gen_seen", gen_dir=tmp_path_factory.mktemp("games"), n=6, seed=5)


def label_of(step) -> str:
    return re.fullmatch(r"(?:<think></think>)?<action>(.*)</action>", step.response).group(1)


def test_detours_are_labelled_with_the_replanned_expert_command(pool):
    with EnvPool(ALFWORLD, pool, num_workers=2, max_steps=50) as envs:
        trajs = expert_episodes(ALFWORLD, envs, list(range(len(pool))), 50, explore=0.4, seed=0)
        plain = expert_episodes(ALFWORLD, envs, list(range(len(pool))), 50)
    assert all(t.won for t in trajs) and all(t.won for t in plain)
    detours = sum(label_of(s) != s.action for t in trajs for s in t.steps)
    assert detours >= 3, "explore=0.4 should leave the plan on several steps"
    assert all(label_of(s) == s.action for t in plain for s in t.steps)
    assert sum(len(t.steps) for t in trajs) > sum(len(t.steps) for t in plain)
    # Independent check: replay the commands actually played on a fresh engine; at every state the
    # engine's own expert plan must start with the recorded label, and the observations must agree.
    env = AlfWorldEnv(max_steps=50)
    for traj in trajs:
        obs = env.reset(pool[traj.task_id], expert=True)
        for step in traj.steps:
            assert step.observation == obs.text
            assert obs.expert_plan[0] == label_of(step)
            obs = env.step(step.action)
            assert step.next_observation == obs.text
        assert obs.won


def test_known_plans_replay_without_the_planner_and_give_the_planners_episodes(pool):
    """Generated games keep the planner's winning plan: replaying it (planner off) gives the same episodes."""
    bare = TaskPool([dataclasses.replace(t, expert_plan=None) for t in pool.tasks])  # the planner plays
    assert len(pool.expert_plans) == len(pool) and not bare.expert_plans
    episodes, expert_flags = {}, {}
    for name, tasks in (("replay", pool), ("planner", bare)):
        with EnvPool(ALFWORLD, tasks, num_workers=2, max_steps=50) as envs:

            def spy(ids, expert=None, _reset=envs.reset, _name=name):
                expert_flags[_name] = expert
                return _reset(ids, expert)

            envs.reset = spy
            episodes[name] = expert_episodes(ALFWORLD, envs, list(range(len(pool))), 50)
    assert expert_flags == {"replay": False, "planner": True}
    assert all(t.won for t in episodes["replay"])
    assert [dataclasses.asdict(t) for t in episodes["replay"]] == [
        dataclasses.asdict(t) for t in episodes["planner"]
    ]


def test_examples_train_the_label_and_show_the_played_history(pool):
    with EnvPool(ALFWORLD, pool, num_workers=2, max_steps=50) as envs:
        trajs = expert_episodes(ALFWORLD, envs, [0, 1], 50, explore=0.5, seed=3)
    compact = ALFWORLD.configured({"prompt": "compact"})  # its history lines read "Did: <command>"
    examples = examples_from_episodes(trajs, compact, history_k=1, horizon=1, predictor=False)
    agent = [e for e in examples if e.role == "agent"]
    assert [e.target for e in agent] == [s.response for t in trajs for s in t.steps]
    checked, offset = 0, 0
    for traj in trajs:
        for j, step in enumerate(traj.steps[:-1]):
            if label_of(step) != step.action:
                assert f"Did: {step.action}" in agent[offset + j + 1].prompt
                checked += 1
        offset += len(traj.steps)
    assert checked > 0


@pytest.mark.parametrize("explore", [-0.1, 1.0])
def test_explore_out_of_range(explore):
    with pytest.raises(ValueError, match="explore"):
        expert_episodes(ALFWORLD, None, [], 10, explore=explore)


def test_length_grouped_batches_cover_every_row_once_per_epoch_with_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(40, 400, size=103)
    batches = length_grouped_batches(lengths, 8, np.random.default_rng(1))
    per_epoch = len(lengths) // 8
    for _ in range(3):
        epoch = [next(batches) for _ in range(per_epoch)]
        seen = np.concatenate(epoch)
        assert len(seen) == len(set(seen.tolist())) == per_epoch * 8  # no row twice in an epoch
        padded = sum(8 * lengths[b].max() for b in epoch)
        random_padded = sum(8 * lengths[rng.choice(len(lengths), 8)].max() for _ in range(per_epoch))
        assert padded < 0.8 * random_padded  # the point of grouping
    tiny = length_grouped_batches([5, 9], 4, np.random.default_rng(0))
    assert next(tiny).shape == (4,) and set(next(tiny).tolist()) <= {0, 1}  # fewer rows than a batch


def test_predictor_targets_are_cut_to_the_tokens_rl_lets_a_prediction_have():
    import jax
    from qwen2_tiny import char_ids as encode
    from qwen2_tiny import tiny_sft_model

    from roleagent_jax.run.warmstart import Example, run_sft

    graphdef, params = tiny_sft_model()

    def examples(cut: int | None) -> list[Example]:
        out = []
        for i in range(8):
            out.append(Example(f"room {i}", f"take key {i} from the drawer", "agent"))
            out.append(
                Example(f"predict {i}", f"you see a long page of items {i} and more"[:cut], "predictor")
            )
        return out

    def sft(exs, n):
        return run_sft(
            graphdef, params, exs, encode, encode, 0, steps=3, batch_rows=4, lr=1e-2, seed=1,
            predictor_target_tokens=n,
        )  # fmt: skip

    cut, cut_losses = sft(examples(None), 6)
    ref, ref_losses = sft(examples(6), 0)  # the same examples with the predictor targets cut by hand
    whole, whole_losses = sft(examples(None), 0)
    assert cut_losses == pytest.approx(ref_losses, rel=1e-6)
    assert cut_losses != pytest.approx(whole_losses, rel=1e-3)
    for a, b in zip(jax.tree.leaves(cut), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_copy_batches_repeat_a_random_run_and_depend_only_on_seed_and_index():
    from roleagent_jax.run.warmstart import copy_batches

    tokens = list(range(10, 60))
    first = [next(b) for b in [copy_batches(tokens, 4, seed=3)] for _ in range(3)]
    again = copy_batches(tokens, 4, seed=3)
    assert [next(again) for _ in range(3)] == first
    assert next(copy_batches(tokens, 4, seed=4)) != first[0]
    for prompts, targets in first:
        assert len(prompts) == len(targets) == 4
        for p, t in zip(prompts, targets):
            assert p == [*t, 10] and 16 <= len(t) <= 48 and set(t) <= set(range(11, 60))
    with pytest.raises(ValueError, match="at least 2"):
        next(copy_batches([5], 4, seed=0))


@pytest.mark.slow  # a whole run end to end (40-140 s on 2 cores): `pytest -m slow`
def test_copy_steps_come_first_and_a_killed_warm_start_resumes_through_them(tmp_path):
    import jax
    from qwen2_tiny import Killed, kill_after, tiny_sft_model
    from qwen2_tiny import char_ids as encode

    from roleagent_jax.run.checkpointing import Checkpointer
    from roleagent_jax.run.warmstart import Example, run_sft

    graphdef, params = tiny_sft_model(max_positions=128)
    examples = [Example(f"go to room {i}", f"take key {i % 5}", "agent") for i in range(8)]

    def sft(copy_steps, checkpoint=None, progress=None):
        return run_sft(
            graphdef, params, examples, encode, encode, 0, steps=3, batch_rows=4, lr=1e-2, seed=2,
            progress=progress, checkpoint=checkpoint, checkpoint_every=2,
            copy_steps=copy_steps, copy_tokens=range(1, 64),
        )  # fmt: skip

    plain, plain_losses = sft(0)
    whole, whole_losses = sft(3)
    assert len(plain_losses) == 3 and len(whole_losses) == 6
    assert whole_losses[0] != pytest.approx(plain_losses[0])  # the first batch is a copy batch
    first = Checkpointer(tmp_path / "ws", keep=2)
    with pytest.raises(Killed):
        sft(3, first, kill_after(5))  # killed inside the examples' steps, last saved at step 4
    first.close()
    second = Checkpointer(tmp_path / "ws", keep=2)
    resumed, losses = sft(3, second)
    second.close()
    assert losses == pytest.approx(whole_losses, rel=0, abs=0)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(whole), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class _Tok:
    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(ch) for ch in text]


def test_a_target_ends_with_eos_only_when_asked():
    assert target_ids(_Tok(), "<answer>x</answer>", end_turn=False)[-1] == ord(">")
    assert target_ids(_Tok(), "<answer>x</answer>", end_turn=True) == [*map(ord, "<answer>x</answer>"), 2]


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_a_constant_warm_start_takes_the_steps_of_torch_adamw_on_the_same_rows(tmp_path, schedule):
    """The PyTorch fine-tune a pretrained model's warm start is measured against (AdamW at a constant rate,
    loss on the target tokens) gives the same loss at every step; the cosine schedule does not: by the
    last steps it has taken half the steps' size, which left a one-epoch warm start half trained."""
    torch = pytest.importorskip("torch")
    from flax import nnx
    from qwen2_tiny import torch_qwen2

    from roleagent_jax.models import load_pretrained
    from roleagent_jax.run.warmstart import Example, run_sft

    reference = torch_qwen2(tie=True, kv_heads=2).train()
    reference.save_pretrained(tmp_path)
    graphdef, params = nnx.split(load_pretrained(tmp_path)[0], nnx.Param)
    rng = np.random.default_rng(0)
    rows = [(rng.integers(1, 128, 12).tolist(), rng.integers(1, 128, 5).tolist()) for _ in range(4)]
    lr, steps = 3e-3, 8

    opt = torch.optim.AdamW(reference.parameters(), lr=lr, weight_decay=0.0)
    ids = torch.tensor([p + t for p, t in rows])
    labels = torch.tensor([[-100] * len(p) + t for p, t in rows])
    expected = []
    for _ in range(steps):  # every row in every step: a batch is the whole set, in any order
        loss = reference(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)  # the warm start clips too
        opt.step()
        opt.zero_grad()
        expected.append(loss.item())

    examples = [Example(str(i), str(i), "agent") for i in range(4)]
    _, losses = run_sft(
        graphdef, params, examples, lambda s: rows[int(s)][0], lambda s: rows[int(s)][1], 0,
        steps=steps, batch_rows=4, lr=lr, seed=0, schedule=schedule,
    )  # fmt: skip
    close = np.allclose(losses, expected, rtol=2e-3)
    assert losses[0] == pytest.approx(expected[0], rel=1e-5)
    assert close == (schedule == "constant"), (losses, expected)


SEARCH_QA = get_family("search_qa")


@pytest.fixture(scope="module")
def qa_episodes():
    """Expert episodes of a small generated search-QA pool: 2 steps (search, answer) or 3 (a second
    search first), and one lost episode the warm start leaves out."""
    pool = SEARCH_QA.task_pool("gen_train", n=24, seed=3)
    with EnvPool(SEARCH_QA, pool, num_workers=1, max_steps=50) as envs:
        trajs = expert_episodes(SEARCH_QA, envs, list(range(len(pool))), 50)
    lost = dataclasses.replace(trajs[-1], won=False)
    return pool, [*trajs[:-1], lost]


def test_with_repeat_1_each_won_step_gives_its_examples_once(pool, qa_episodes):
    """Each won episode's steps in order: the expert's answer, and for the `predictor_fraction` share of
    steps (spread evenly) the next `horizon` observations; a lost episode gives nothing."""
    from roleagent_jax import wia
    from roleagent_jax.run.warmstart import episode_examples

    with EnvPool(ALFWORLD, pool, num_workers=2, max_steps=50) as envs:
        trajs = expert_episodes(ALFWORLD, envs, list(range(len(pool))), 50, explore=0.4, seed=1)
    cases = [(ALFWORLD, trajs), (SEARCH_QA, qa_episodes[1])]
    for family, episodes in cases:
        for predictor, fraction in ((True, 1.0), (True, 0.4), (False, 1.0)):
            args = (episodes, family, 2, 2, predictor, fraction)
            blocks = episode_examples(*args)
            flat = [e for block in blocks for e in block]
            assert examples_from_episodes(*args) == examples_from_episodes(*args, long_repeat=1) == flat
            n_won, n_predicted = 0, 0
            for traj, block in zip(episodes, blocks, strict=True):
                agent = [i for i, e in enumerate(block) if e.role == "agent"]
                assert [block[i].target for i in agent] == (
                    [s.response for s in traj.steps] if traj.won else []
                )
                for t, i in enumerate(agent):
                    following = block[i + 1 : (agent + [len(block)])[t + 1]]
                    future = [s.next_observation for s in traj.steps[t : t + 2]]
                    assert [(e.role, e.target) for e in following] in (
                        [], [("predictor", wia.format_predictions(future))]
                    )  # fmt: skip
                    n_predicted += len(following)
                n_won += len(agent)
            assert abs(n_predicted - (fraction * n_won if predictor else 0)) <= 1
            assert not predictor or n_predicted > 0


def test_the_examples_of_episodes_longer_than_the_median_come_3_times(qa_episodes):
    from collections import Counter

    from roleagent_jax.run.warmstart import episode_examples, longer_than_median

    pool, trajs = qa_episodes
    won = [t for t in trajs if t.won]
    assert {len(t.steps) for t in won} == {2, 3}
    long, median = longer_than_median(trajs)
    assert median == np.median([len(t.steps) for t in won])
    assert long == [t.won and len(t.steps) == 3 for t in trajs] and 0 < sum(long) < len(won)
    assert all(t.steps[1].response.startswith("<search>") for t, is_long in zip(trajs, long) if is_long)
    multi_hop = {"bridge", "bridge3", "comparison"}
    assert {pool[t.task_id].type for t, is_long in zip(trajs, long) if is_long} <= multi_hop
    args = (trajs, SEARCH_QA, 2, 2, True, 0.5)
    once = examples_from_episodes(*args)
    weighted = examples_from_episodes(*args, long_repeat=3)
    counts = Counter((e.prompt, e.target, e.role) for e in weighted)
    blocks = episode_examples(*args)
    assert not blocks[-1] and not long[-1]  # the lost episode gives no example
    for block, is_long in zip(blocks, long):
        for e in block:
            assert counts[(e.prompt, e.target, e.role)] == (3 if is_long else 1)
    n_long = sum(len(b) for b, is_long in zip(blocks, long) if is_long)
    roles = {e.role for b, is_long in zip(blocks, long) if is_long for e in b}
    assert n_long and roles == {"agent", "predictor"}
    assert len(weighted) == len(once) + 2 * n_long
    assert [e for e in weighted if counts[(e.prompt, e.target, e.role)] == 1] == [
        e for e in once if counts[(e.prompt, e.target, e.role)] == 1
    ]  # the others keep their order
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        examples_from_episodes(*args, long_repeat=0)


def test_the_warm_start_says_how_many_examples_the_long_episodes_give(qa_episodes, tmp_path, capsys):
    from conftest import load_config

    from roleagent_jax.run.setup import Experts

    pool, trajs = qa_episodes
    c = load_config("base")
    c.env.name = "search_qa"
    for repeat in (1, 3):
        c.warmstart.long_repeat = repeat
        experts = Experts(c, SEARCH_QA, pool, tmp_path)
        experts._trajectories = trajs  # the expert's games, already played
        examples = experts.examples()
        printed = capsys.readouterr().out
        assert examples == examples_from_episodes(
            trajs, SEARCH_QA, c.env.history_k, c.wia.horizon, c.warmstart.predictor,
            c.warmstart.predictor_fraction, long_repeat=repeat,
        )  # fmt: skip
    from roleagent_jax.run.warmstart import longer_than_median

    won, median = sum(t.won for t in trajs), longer_than_median(trajs)[1]
    line = [s for s in printed.splitlines() if "longer than the median" in s]
    assert len(line) == 1 and re.fullmatch(
        rf"warm start: \d+ of {won} won expert episodes longer than the median \({median:g} steps\), their \d+ "
        rf"examples x3: \d+ of {len(examples)} examples",
        line[0],
    ), printed


def test_long_repeat_below_1_is_refused_in_one_line_naming_it():
    from conftest import load_config

    from roleagent_jax.config import validate

    c = load_config("base")
    c.warmstart.long_repeat = 0
    with pytest.raises(ValueError) as err:
        validate(c)
    lines = [s for s in str(err.value).splitlines() if "long_repeat" in s]
    assert len(lines) == 1 and "--config.warmstart.long_repeat=0" in lines[0] and ">= 1" in lines[0]
