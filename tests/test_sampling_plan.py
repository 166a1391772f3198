"""The sampler's call planner (`sampling.plan`): padded positions against hand-computed shapes, and the
sampler's results with calls cut into chunks by prompt length against the same call run whole."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from qwen2_tiny import TEXTS, assert_same_results, left_padded, saved_sampling_model

from roleagent_jax.sampling import Sampler, SampleRequest, SamplingParams
from roleagent_jax.sampling.plan import ACCELERATOR, CPU, SMOLLM2_WEIGHTS, Buckets, cost_model, plan_call

BUCKETS = Buckets.make(batch=(8, 16, 32), prompt=(64, 128, 256, 512), max_new_tokens_cap=64)
CUTS = dataclasses.replace(CPU, compile=0.0)  # the CPU's padding and decode costs without the compile
CHARGED = dataclasses.replace(CPU, compile=6000.0)  # a compile of 6,000 positions: a call's whole cost


def _shapes(plan):
    return [(c.rows, c.prompt_bucket) for c in plan.chunks]


def test_prompts_of_two_lengths_run_in_two_chunks_when_that_saves_prefill():
    """6 prompts of 100 tokens between 6 of 300, 16 new tokens each. Whole: 16 rows x 512 slots = 8192
    prefilled positions, cost 8192 + 16 x (2 x 16 + 20) = 9024 without compiles (`CUTS`). Cut: 8 x 128 + 8 x 512 =
    5120 positions, cost 5120 + 2 x 16 x (2 x 8 + 20) = 6272: cut, short prompts first. On an
    accelerator each decode loop costs 16 x 4096 more: whole."""
    reqs = [SampleRequest([1] * (100 if i % 2 == 0 else 300), 16) for i in range(12)]
    plan = plan_call(reqs, BUCKETS, CUTS)
    assert _shapes(plan) == [(8, 128), (8, 512)]
    assert [c.requests for c in plan.chunks] == [(0, 2, 4, 6, 8, 10), (1, 3, 5, 7, 9, 11)]
    assert (plan.prefill_positions, plan.real_tokens, plan.cost(CUTS)) == (5120, 2400, 6272)
    whole = plan_call(reqs, BUCKETS, ACCELERATOR)
    assert _shapes(whole) == [(16, 512)] and whole.prefill_positions == 8192
    assert (
        whole.chunks[0].requests == tuple(range(12)) and whole.foreground_rows == plan.foreground_rows == 16
    )
    # 7 prompts of 100 tokens and 1 of 130: whole (8 x 256 = 2048) beats cut (8 x 128 + 8 x 256).
    few = [SampleRequest([1] * 100, 16)] * 7 + [SampleRequest([1] * 130, 16)]
    assert _shapes(plan_call(few, BUCKETS, CUTS)) == [(8, 256)]


def test_a_cut_pays_a_compile_for_each_shape_it_adds():
    """The call above saves 9024 - 6272 = 2752 by its cut; with a charge of 6000 for each distinct
    chunk shape, whatever ran before (the plan reads only the requests): whole 9024 + 6000 beats cut
    6272 + 2 x 6000. 32 prompts of 40 tokens between 32 of 500 run in two chunks of one shape (32 x 512,
    one compile) in request order, or cut into 32 x 64 and 32 x 512: 14336 positions fewer, more than
    the second shape's compile, so cut; at 20000 a shape they stay in request order."""
    reqs = [SampleRequest([1] * (100 if i % 2 == 0 else 300), 16) for i in range(12)]
    whole = plan_call(reqs, BUCKETS, CHARGED)
    assert [c.shape for c in whole.chunks] == [(16, 512, 16, None)]
    assert whole.cost(CHARGED) == 9024 + CHARGED.compile
    cut = plan_call(reqs, BUCKETS, CUTS)
    assert cut.cost(CHARGED) == 6272 + 2 * CHARGED.compile
    wide = [SampleRequest([1] * (40 if i % 2 == 0 else 500), 16) for i in range(64)]
    cut = plan_call(wide, BUCKETS, CHARGED)
    assert _shapes(cut) == [(32, 64), (32, 512)]
    decode = 16 * (2 * 32 + 20)  # a 32-row chunk's 16 steps
    assert cut.cost(CHARGED) == 32 * 64 + 32 * 512 + 2 * decode + 2 * CHARGED.compile
    # at 20000 a shape the cut saves less than its second shape costs, and the request order's two
    # chunks of one shape pay one compile: they stay
    dear = dataclasses.replace(CPU, compile=20000.0)
    in_order = plan_call(wide, BUCKETS, dear)
    assert _shapes(in_order) == [(32, 512)] * 2
    assert in_order.cost(CHARGED) - cut.cost(CHARGED) == 14336 - CHARGED.compile
    same = plan_call([SampleRequest([1] * 100, 16)] * 64, BUCKETS, CHARGED)  # two chunks of one shape
    assert (
        _shapes(same) == [(32, 128)] * 2 and same.cost(CHARGED) == 2 * (32 * 128 + decode) + CHARGED.compile
    )


def test_the_compile_charge_scales_with_the_models_weights():
    """A compile takes about as long for any model on a CPU while a position costs in proportion to the
    weights: SmolLM2 is charged `CPU.compile`, a model 100x smaller 100x more; accelerators nothing."""
    assert cost_model("cpu", SMOLLM2_WEIGHTS) == CPU
    assert cost_model("cpu", SMOLLM2_WEIGHTS // 100).compile == pytest.approx(100 * CPU.compile, rel=1e-6)
    assert cost_model("tpu", 1000) == cost_model("gpu", SMOLLM2_WEIGHTS) == ACCELERATOR


def test_waiting_background_rows_are_not_padded_to_the_foreground_rows_when_that_costs():
    """After a 32-row foreground call, 13 background rows (8 of 100 tokens, 5 of 300; grouped) ran in
    one plain chunk padded to 32 rows x 512 = 16384 positions; cut: 8 x 128 + 8 x 512 = 5120. Rows
    that fill the foreground's shape keep it (no new program)."""
    reqs = [SampleRequest([1] * 100, 16, group="g", background=True)] * 8
    reqs += [SampleRequest([1] * 300, 16, background=True)] * 5
    plan = plan_call(reqs, BUCKETS, CUTS, foreground_rows=32)
    assert _shapes(plan) == [(8, 128), (8, 512)] and plan.prefill_positions == 5120
    assert all(c.layout is None for c in plan.chunks) and plan.foreground_rows == 0
    full = [SampleRequest([1] * 300, 16, background=True)] * 32
    assert _shapes(plan_call(full, BUCKETS, CUTS, foreground_rows=32)) == [(32, 512)]
    assert _shapes(plan_call(full[:5], BUCKETS, CUTS, foreground_rows=8)) == [(8, 512)]


def test_background_rows_beside_foreground_ones_share_one_chunk_that_runs_last():
    """A group of 7 identical 300-token prompts shares 299 tokens; two loose foreground prompts and the
    background rows would make every row keep 256 prompt slots in one chunk."""
    reqs = [SampleRequest([5] * 300, 16, group="g")] * 7
    reqs += [SampleRequest([2] * 100, 40, background=True), SampleRequest([3] * 200, 8)]
    reqs += [SampleRequest([4] * 90, 40, background=True), SampleRequest([6] * 150, 8)]
    plan = plan_call(reqs, BUCKETS, CUTS)
    assert not plan.waiting and len(plan.chunks) > 1
    last = plan.chunks[-1]
    assert {7, 9} <= set(last.requests)
    assert all(not plan.requests[i].background for c in plan.chunks[:-1] for i in c.requests)
    assert plan.requests[7].max_new_tokens == 16  # capped at the foreground's largest budget
    one = plan_call(reqs, BUCKETS, ACCELERATOR)
    assert len(one.chunks) == 1 and plan.prefill_positions < one.prefill_positions


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tok, module, cfg, graphdef, params = saved_sampling_model(tmp_path_factory.mktemp("tiny_qwen2_plan"))
    # One chunk whatever the call (a single batch and prompt bucket), and the cutting sampler.
    whole = Sampler(graphdef, cfg, tok, eos_ids=(), batch_buckets=(16,), prompt_buckets=(128,))
    cut = Sampler(
        graphdef, cfg, tok, eos_ids=(), batch_buckets=(4, 8, 16), prompt_buckets=(8, 16, 32, 64, 128)
    )
    cut.cost_model = CUTS  # the CPU's cuts on any platform; a compile charge would keep these calls whole
    return {"tok": tok, "module": module, "params": params, "cfg": cfg, "whole": whole, "cut": cut}


def test_the_weights_a_position_costs_are_the_models_matrices(model):
    """`matmul_weights` against the model itself: every weight matrix (the projections and the LM head;
    not biases, norms) but the embedding table, which a position looks up, not multiplies."""
    cfg = model["cfg"]
    leaves = jax.tree_util.tree_flatten_with_path(model["params"])[0]
    matrices = sum(x.size for path, x in leaves if x.ndim >= 2 and "bias" not in jax.tree_util.keystr(path))
    assert not cfg.tie_word_embeddings
    assert cfg.matmul_weights == matrices - cfg.vocab_size * cfg.hidden_size
    assert model["whole"].cost_model == cost_model("cpu", cfg.matmul_weights)  # what the sampler plans with


def _mixed(tok) -> list[SampleRequest]:
    """Foreground: a group of 4 identical 98-token prompts (the longest budget), a group of 3 with a
    60-token head (one scoring its last 2 tokens), 2 short loose prompts; background predictor rows, two
    of them grouped. 9 foreground rows take the 16-row bucket, so all 4 background rows join."""
    e = tok.encode
    head_a, head_b = e(" ".join(TEXTS)), e(" ".join(TEXTS[::-1]))[:60]
    reqs = [SampleRequest(head_a, 12, group="A") for _ in range(2)]
    reqs.append(SampleRequest(e(TEXTS[2])[:7], 11, role="predictor", background=True))
    tails = ("a", " open", "the knife 2 is here")
    reqs += [
        SampleRequest(head_b + e(t), 5, group="B", score_tokens=2 * (k == 1)) for k, t in enumerate(tails)
    ]
    reqs.append(SampleRequest(e(TEXTS[1])[:9], 3))
    reqs += [SampleRequest(e(TEXTS[0])[:5], 16, role="predictor", group="A", background=True),
             SampleRequest(e(TEXTS[2])[:12], 16, role="predictor", group="A", background=True)]  # fmt: skip
    reqs += [SampleRequest(head_a, 12, group="A") for _ in range(2)]
    reqs.append(SampleRequest(e(TEXTS[3])[5:18], 4))
    reqs.append(SampleRequest(e("a"), 16, role="predictor", background=True))
    return reqs


def test_cut_calls_give_the_whole_calls_greedy_results(model):
    """Mixed lengths, groups, a scored prompt and background rows, the group "A" rows ended early by a
    stop: cut into chunks by prompt length, every request gets the tokens, log-probs, prompt scores and
    finish reason of the call run whole, in request order, and each background row, in a chunk of its
    own rows, decodes exactly as long as the longest foreground response of the whole call."""
    tok, params, whole, cut = model["tok"], model["params"], model["whole"], model["cut"]
    greedy = SamplingParams(greedy=True)
    reqs = _mixed(tok)
    first = whole.generate(params, reqs, greedy, jax.random.key(0))
    stop = (tok.decode(first[0].token_ids[:10]),)  # their whole text at their 10th token
    reqs = [dataclasses.replace(r, stop=stop) if r.group == "A" and r.role == "agent" else r for r in reqs]

    plan = cut.plan(reqs)
    assert len(whole.plan(reqs).chunks) == 1 and len(plan.chunks) >= 2
    background = {i for i, r in enumerate(reqs) if r.background}
    assert background <= set(plan.chunks[-1].requests) and plan.prefill_positions < 16 * 128
    ref = whole.generate(params, reqs, greedy, jax.random.key(0))
    out = cut.generate(params, reqs, greedy, jax.random.key(0))
    assert_same_results(out, ref)
    assert len(out[4].prompt_logprobs) == 2

    longest = max(len(o.token_ids) for i, o in enumerate(out) if i not in background)
    own = max(len(out[i].token_ids) for i in plan.chunks[-1].requests if i not in background)
    assert out[0].finish_reason == "stop" and own < longest == 10
    for i in background:
        assert len(out[i].token_ids) == min(longest, reqs[i].max_new_tokens)
        assert out[i].finish_reason == ("paused" if longest < reqs[i].max_new_tokens else "length")


def test_cut_calls_sample_from_the_policy_and_reuse_their_programs(model):
    """Sampled rows of a cut call: each token's log-prob is the training forward's, a seed repeats the
    call, and new weights compile nothing new."""
    tok, params, cut, module = model["tok"], model["params"], model["cut"], model["module"]
    reqs = _mixed(tok)
    warm = SamplingParams(temperature=1.0)
    out = cut.generate(params, reqs, warm, jax.random.key(3))
    again = cut.generate(params, reqs, warm, jax.random.key(3))
    assert [o.token_ids for o in out] == [o.token_ids for o in again]
    rows = [r.prompt_ids + o.token_ids for r, o in zip(reqs, out)]
    ids, mask = left_padded(rows)
    logp = np.asarray(jax.nn.log_softmax(module(jnp.asarray(ids), jnp.asarray(mask)), axis=-1))
    width = ids.shape[1]
    for b, o in enumerate(out):
        start = width - len(o.token_ids)
        ref = logp[b, np.arange(start - 1, width - 1), o.token_ids]
        np.testing.assert_allclose(o.logprobs, ref, atol=1e-4, rtol=0)
    compiled = cut.num_compilations
    cut.generate(jax.tree.map(lambda x: x * 1.01, params), reqs, warm, jax.random.key(4))
    assert cut.num_compilations == compiled
