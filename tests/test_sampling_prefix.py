"""Shared-prefix sampling against the plain per-row path: the same greedy tokens and log-probs (1e-5)
on mixed batches (several groups, ragged suffixes, identical prompts, ungrouped rows, stop strings), on
one device and on the fake 8-device mesh; sampled log-probs against the training forward; the exact
attention merge against attention over all keys; the layout planner's choices."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from qwen2_tiny import TEXTS, assert_same_results, left_padded, saved_sampling_model

from roleagent_jax.models import load_pretrained
from roleagent_jax.models.qwen2 import (
    attention_partials,
    grouped_attention,
    merge_attention,
    prefix_attention_partials,
)
from roleagent_jax.rl.logprobs import token_logprobs
from roleagent_jax.sampling import Sampler, SampleRequest, SamplingParams
from roleagent_jax.sampling.prefix import chunk_by_group, plan_layout

GREEDY = SamplingParams(greedy=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen2_prefix")
    tok, model, cfg, graphdef, params = saved_sampling_model(path)
    sampler = Sampler(graphdef, cfg, tok, eos_ids=(), prompt_buckets=(16, 128))
    return {"tok": tok, "path": path, "model": model, "params": params, "sampler": sampler}


def _requests(tok) -> list[SampleRequest]:
    """Two groups with long shared heads and ragged suffixes (one pair identical), a group of identical
    prompts (a group's first step), two predictor rows with group "A"'s head and key (a different role:
    their own group), a group of one and two ungrouped rows; varied max_new_tokens. With prompt
    buckets (16, 128) sharing pays: rows keep 16 prompt slots instead of 128."""
    head_a = tok.encode(" ".join(TEXTS))
    head_b = tok.encode(" ".join(TEXTS[::-1]))
    same = tok.encode(" ".join(TEXTS[1:] + TEXTS[:1]))[:100]
    tails = ["take apple 1", " open", "go to fridge 1 and look", "take apple 1", "x"]
    reqs = [SampleRequest(head_a + tok.encode(t), 12 + k, group="A") for k, t in enumerate(tails)]
    reqs += [SampleRequest(head_b + tok.encode(t), 9, group="B") for t in ("a", "the knife 2 is here")]
    reqs += [SampleRequest(same, 10, group=7) for _ in range(3)]
    reqs += [
        SampleRequest(head_a + tok.encode(t), 8, role="predictor", group="A") for t in (" mug", " knife")
    ]
    reqs.append(SampleRequest(tok.encode(TEXTS[1])[:12], 12, group="solo"))
    reqs += [SampleRequest(tok.encode(TEXTS[1])[:9], 16), SampleRequest(tok.encode(TEXTS[3])[5:18], 11)]
    return reqs


def _ungrouped(reqs):
    return [dataclasses.replace(r, group=None) for r in reqs]


def _common(prompts) -> int:
    """Longest common prefix, counted token by token."""
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def _with_stops(tok, reqs, plain_out):
    """Stops that end rows 1 and 5 early (a stop inside each one's plain output), a never-matching stop
    on row 7."""
    reqs = list(reqs)
    for b, j in ((1, 6), (5, 4)):
        text = tok.decode(plain_out[b].token_ids[: j + 1])
        reqs[b] = dataclasses.replace(reqs[b], stop=(text[-3:],))
    reqs[7] = dataclasses.replace(reqs[7], stop=("\x00never",))
    return reqs


def test_shared_prefix_greedy_equals_plain_path(setup):
    tok, sampler, params = setup["tok"], setup["sampler"], setup["params"]
    reqs = _requests(tok)
    reqs = _with_stops(tok, reqs, sampler.generate(params, _ungrouped(reqs), GREEDY, jax.random.key(0)))
    ref = sampler.generate(params, _ungrouped(reqs), GREEDY, jax.random.key(0))
    assert sampler.last_layout is None  # no groups: the plain layout
    out = sampler.generate(params, reqs, GREEDY, jax.random.key(0))
    layout = sampler.last_layout
    assert layout is not None
    assert_same_results(out, ref)
    assert [o.finish_reason for o in out].count("stop") == 2 and out[7].finish_reason == "length"
    assert len({len(o.token_ids) for o in out}) > 3 and len({tuple(o.token_ids) for o in out}) > 3

    # Every request has one row; a sharing group's rows sit in grid groups of its own holding its
    # longest common prefix (all but the last token for identical prompts); the group of one and the
    # ungrouped rows share nothing.
    grid = layout.slots.reshape(layout.groups, layout.rows_per_group)
    assert sorted(s for s in layout.slots if s >= 0) == list(range(len(reqs)))
    where = {int(s): g for g, row in enumerate(grid) for s in row if s >= 0}
    for members in ([0, 1, 2, 3, 4], [5, 6], [7, 8, 9], [10, 11]):
        prompts = [reqs[i].prompt_ids for i in members]
        share = min(_common(prompts), min(map(len, prompts)) - 1)
        assert share > 90 and all(layout.prefix_len[where[i]] == share for i in members)
        assert {s for i in members for s in grid[where[i]] if s >= 0} == set(members)
    assert layout.prefix_len[where[7]] == len(reqs[7].prompt_ids) - 1
    assert where[0] != where[10] and where[1] != where[11]  # same key, other role: not shared
    assert all(layout.prefix_len[where[i]] == 0 for i in (12, 13, 14))
    # The rows' own cache no longer holds the shared heads: 16 prompt slots per row instead of 128.
    assert (layout.suffix_bucket, layout.prefix_bucket) == (16, 128)


def test_shared_prefix_on_the_8_device_mesh_with_scanned_layers(setup):
    from roleagent_jax.parallel.sharding import make_mesh

    tok = setup["tok"]
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    model, cfg = load_pretrained(setup["path"], mesh=mesh, scan_layers=True)
    graphdef, params = nnx.split(model)
    sampler = Sampler(graphdef, cfg, tok, mesh, eos_ids=(), prompt_buckets=(16, 128))
    reqs = _requests(tok)
    ref = setup["sampler"].generate(setup["params"], _ungrouped(reqs), GREEDY, jax.random.key(0))
    reqs = _with_stops(tok, reqs, ref)
    ref = setup["sampler"].generate(setup["params"], _ungrouped(reqs), GREEDY, jax.random.key(0))
    out = sampler.generate(params, reqs, GREEDY, jax.random.key(0))
    layout = sampler.last_layout
    assert layout is not None and layout.groups % 4 == 0  # whole groups on each of the 4 batch shards
    assert_same_results(out, ref)


def test_sampled_logprobs_equal_the_training_forward(setup):
    """Sampling (temperature 1.2, top-k 8) through shared prefixes: each token's log-prob is the
    teacher-forced forward's, and a seed fixes the output."""
    tok, sampler, params = setup["tok"], setup["sampler"], setup["params"]
    reqs = _requests(tok)
    warm = SamplingParams(temperature=1.2, top_k=8)
    out = sampler.generate(params, reqs, warm, jax.random.key(3))
    assert sampler.last_layout is not None
    again = sampler.generate(params, reqs, warm, jax.random.key(3))
    assert [o.token_ids for o in out] == [o.token_ids for o in again]
    rows = [r.prompt_ids + o.token_ids for r, o in zip(reqs, out)]
    ids, mask = left_padded(rows)
    width = ids.shape[1]
    logp = np.asarray(jax.nn.log_softmax(setup["model"](jnp.asarray(ids), jnp.asarray(mask)), axis=-1))
    for b, o in enumerate(out):
        assert len(o.token_ids) == reqs[b].max_new_tokens
        start = width - len(o.token_ids)
        np.testing.assert_allclose(
            o.logprobs, logp[b, np.arange(start - 1, width - 1), o.token_ids], atol=1e-4
        )


def test_scored_prompt_tokens_stay_out_of_the_shared_prefix(setup):
    """Rows of a sharing group that score their last k prompt tokens (forced openers, a forced step that
    generates nothing, identical prompts) keep k + 1 tokens of their own, so the prefix stops short of
    them: the scores and tokens are the plain layout's, and the scores the training forward's."""
    tok, sampler, params = setup["tok"], setup["sampler"], setup["params"]
    head = tok.encode(" ".join(TEXTS))
    same = tok.encode(" ".join(TEXTS[1:] + TEXTS[:1]))[:100]
    reqs = [
        SampleRequest(head + tok.encode(t), n, group="A", score_tokens=k)
        for t, n, k in ((" take apple 1", 6, 3), (" take apple 2", 5, 0), (" go to fridge 1", 0, 6))
    ]
    reqs += [SampleRequest(same, 7, group="B", score_tokens=2) for _ in range(2)]  # fmt: skip
    out = sampler.generate(params, reqs, GREEDY, jax.random.key(0))
    layout = sampler.last_layout
    assert layout is not None
    where = {
        int(s): g for g, row in enumerate(layout.slots.reshape(layout.groups, -1)) for s in row if s >= 0
    }
    for members in ([0, 1, 2], [3, 4]):
        own = min(len(reqs[i].prompt_ids) - reqs[i].score_tokens - 1 for i in members)
        share = min(_common([reqs[i].prompt_ids for i in members]), own)
        assert share > 90 and all(layout.prefix_len[where[i]] == share for i in members)
    assert_same_results(out, sampler.generate(params, _ungrouped(reqs), GREEDY, jax.random.key(0)))
    ids, mask = left_padded([r.prompt_ids for r in reqs])
    ref, _ = token_logprobs(setup["model"](jnp.asarray(ids), jnp.asarray(mask)), jnp.asarray(ids))
    for b, (r, o) in enumerate(zip(reqs, out)):
        assert len(o.prompt_logprobs) == r.score_tokens
        if r.score_tokens:
            np.testing.assert_allclose(o.prompt_logprobs, ref[b, -r.score_tokens :], atol=1e-4, rtol=0)


def test_shared_layouts_compile_once_per_shape(setup):
    tok, sampler = setup["tok"], setup["sampler"]
    params = setup["params"]
    reqs = _requests(tok)
    sampler.generate(params, reqs, GREEDY, jax.random.key(0))
    before = sampler.num_compilations
    for k in range(3):  # new weights, other suffixes of the same lengths: the same programs
        params = jax.tree.map(lambda x: x * 1.01, params)
        shifted = [dataclasses.replace(r, prompt_ids=r.prompt_ids[:-1] + [(k + 3) % 150]) for r in reqs]
        sampler.generate(params, shifted, GREEDY, jax.random.key(k))
        assert sampler.last_layout is not None
    assert sampler.num_compilations == before


def test_merge_of_prefix_and_own_attention_equals_attention_over_all_keys():
    """Groups of rows share prefix keys (one group's prefix empty): merging the per-group and per-row
    partial attentions gives attention over each row's concatenated keys."""
    rng = np.random.default_rng(0)
    groups, rows, t, heads, kv, d, lp, s = 3, 2, 3, 4, 2, 8, 5, 6
    b = groups * rows
    q = jnp.asarray(rng.normal(size=(b, t, heads, d)), jnp.float32)
    pk, pv = (jnp.asarray(rng.normal(size=(groups, kv, lp, d)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(b, kv, s, d)), jnp.float32) for _ in range(2))
    pmask = np.ones((groups, lp), bool)
    pmask[0, :2] = False  # left padding
    pmask[2] = False  # a group without a shared prefix
    mask = rng.random((b, t, s)) < 0.7
    mask[:, :, -1] = True  # every query sees at least its own slot
    merged = merge_attention(
        prefix_attention_partials(q, pk, pv, jnp.asarray(pmask)),
        attention_partials(q, k, v, jnp.asarray(mask)),
    ).reshape(b, t, heads, d)
    group_of = np.arange(b) // rows
    full_k = jnp.concatenate([pk[group_of], k], axis=2)
    full_v = jnp.concatenate([pv[group_of], v], axis=2)
    full_mask = np.concatenate([np.broadcast_to(pmask[group_of][:, None], (b, t, lp)), mask], axis=2)
    want = grouped_attention(q, full_k, full_v, jnp.asarray(full_mask))
    np.testing.assert_allclose(np.asarray(merged), np.asarray(want), atol=1e-6)


def test_layout_planner_shares_what_pays():
    def plan(prompts, keys, row_multiple=1, batch_buckets=(8, 16, 32, 64)):
        return plan_layout(
            prompts, keys, new_tokens=8, prompt_buckets=(8, 16, 32, 64, 128), batch_buckets=batch_buckets,
            row_multiple=row_multiple,
        )  # fmt: skip

    head = list(range(100, 160))
    # Four groups of eight rows with 60 shared tokens: one grid group each, 4 x 8 rows.
    prompts = [head + [g, r, 1] for g in range(4) for r in range(8)]
    keys = [g for g in range(4) for _ in range(8)]
    layout = plan(prompts, keys)
    assert (layout.groups, layout.rows_per_group, layout.prefix_bucket, layout.suffix_bucket) == (4, 8, 64, 8)
    assert list(layout.prefix_len) == [61] * 4  # the head and the group's own first token
    assert list(layout.slots) == list(range(32))
    # Eight batch shards must each hold whole groups: 8 grid groups of 4 rows beat 8 of 8 (half idle).
    layout = plan(prompts, keys, row_multiple=8)
    assert (layout.groups, layout.rows_per_group) == (8, 4)
    # Identical prompts share all but their last token; the grid fills the smallest batch bucket (8).
    layout = plan([head] * 3, ["g"] * 3)
    assert (layout.rows, layout.rows_per_group, layout.suffix_bucket) == (8, 4, 8)
    assert list(layout.prefix_len) == [59, 0] and list(layout.slots) == [0, 1, 2, -1] + [-1] * 4
    # No group, a group of one, nothing in common, or a prefix too short to pay: the plain layout.
    assert plan(prompts, [None] * 32) is None
    assert plan([head, head[::-1]], ["a", "b"]) is None
    assert plan([head, head[::-1]], ["a", "a"]) is None
    assert plan([[1, 2] + head, [1, 3] + head], ["a", "a"]) is None
    # Groups of 3, 3 and 2 rows with 8-row calls: grid groups of 3 (9 rows: a grid may exceed the
    # largest bucket by less than one group), not of 4 (12 rows).
    layout = plan(
        prompts[:3] + prompts[8:11] + prompts[16:18], keys[:3] + keys[8:11] + keys[16:18], batch_buckets=(8,)
    )
    assert (layout.groups, layout.rows_per_group) == (3, 3) and list(layout.slots) == list(range(8)) + [-1]


def test_groups_of_five_and_calls_of_whole_groups():
    head = list(range(100, 160))
    prompts = [head + [g, r] for g in range(6) for r in range(5)]
    layout = plan_layout(
        prompts,
        [g // 5 for g in range(30)],
        new_tokens=8,
        prompt_buckets=(8, 64),
        batch_buckets=(8, 16, 32, 64),
    )
    assert (layout.groups, layout.rows_per_group) == (7, 5)  # 35 rows cover the 32-row bucket
    assert list(layout.slots) == list(range(30)) + [-1] * 5
    keys = [None, "a", "b", "a", None, "b", "c", "c", "c"]
    assert chunk_by_group(keys, 4) == [[0, 1, 3], [2, 5, 4], [6, 7, 8]]
    assert chunk_by_group(["a"] * 6, 4) == [[0, 1, 2, 3], [4, 5]]
    assert chunk_by_group([None] * 9, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


def test_more_requests_than_a_call_holds_keep_their_order(setup):
    """With 8-row calls the groups (2, 5 and 3 rows) go to two calls whole, each sharing its groups'
    prefixes; every result lands at its request's index and equals the plain path's."""
    tok = setup["tok"]
    small = Sampler(setup["sampler"].graphdef, setup["sampler"].config, tok, eos_ids=(), batch_buckets=(8,),
                    prompt_buckets=(16, 128))  # fmt: skip
    reqs = _requests(tok)[:10]
    reqs = reqs[5:7] + reqs[:5] + reqs[7:]  # group B first, then A, then group 7
    chunks = [set(c.requests) for c in small.plan(reqs).chunks]
    assert len(chunks) == 2 and all(c.layout is not None for c in small.plan(reqs).chunks)
    for group in ("A", "B", 7):
        members = {i for i, r in enumerate(reqs) if r.group == group}
        assert sum(members <= c for c in chunks) == 1
    out = small.generate(setup["params"], reqs, GREEDY, jax.random.key(0))
    assert_same_results(
        out, setup["sampler"].generate(setup["params"], _ungrouped(reqs), GREEDY, jax.random.key(0))
    )


def test_bad_group_raises(setup):
    with pytest.raises(ValueError, match="group must be hashable"):
        setup["sampler"].generate(
            setup["params"], [SampleRequest([1, 2], 4, group=[1])], GREEDY, jax.random.key(0)
        )
