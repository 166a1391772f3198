"""The batched sampler against independent references: transformers `generate`, the training forward,
plain-Python string search, and itself on one device vs the fake 8-device mesh."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from qwen2_tiny import TEXTS, game_tokenizer, left_padded, sampling_qwen2

from roleagent_jax.models import load_pretrained
from roleagent_jax.rl.logprobs import token_logprobs
from roleagent_jax.sampling import Sampler, SampleRequest, SamplingParams
from roleagent_jax.sampling import stops as stops_lib

PROMPTS = ["You arrive at", "Your task is to: put a clean apple in fridge. <think>I", "<action>take the", "a"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = game_tokenizer()
    hf = sampling_qwen2(len(tok))
    path = tmp_path_factory.mktemp("tiny_qwen2")
    hf.save_pretrained(str(path))
    model, cfg = load_pretrained(path)
    graphdef, params = nnx.split(model)
    prompts = [tok.encode(t) for t in PROMPTS]
    return {"tok": tok, "hf": hf, "path": path, "model": model, "cfg": cfg, "graphdef": graphdef,
            "params": params, "prompts": prompts}  # fmt: skip


@pytest.fixture(scope="module")
def plain(setup):
    """A single-device sampler without EOS (random models emit the EOS id by chance)."""
    return Sampler(setup["graphdef"], setup["cfg"], setup["tok"], eos_ids=(), prompt_buckets=(16, 32, 64))


@pytest.fixture(scope="module")
def greedy_run(setup, plain):
    reqs = [SampleRequest(p, 16) for p in setup["prompts"]]
    return plain.generate(setup["params"], reqs, SamplingParams(greedy=True), jax.random.key(0))


def _hf_greedy(hf, prompts, new_tokens, pad):
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, eos_token_id=None, pad_token_id=pad,
    )  # fmt: skip
    return out[:, width:].tolist()


def test_greedy_equals_transformers_generate(setup, greedy_run):
    assert len({len(p) for p in setup["prompts"]}) == len(setup["prompts"])  # all lengths differ
    expected = _hf_greedy(setup["hf"], setup["prompts"], 16, setup["tok"].pad_token_id)
    for res, ref in zip(greedy_run, expected):
        assert res.token_ids == ref
        assert res.finish_reason == "length"
        assert res.text == setup["tok"].decode(ref)
    assert len({tuple(r.token_ids) for r in greedy_run}) > 1


def test_logprobs_equal_teacher_forced_forward_and_top_k_holds(setup, plain):
    reqs = [SampleRequest(p, 10 + i) for i, p in enumerate(setup["prompts"])]
    out = plain.generate(setup["params"], reqs, SamplingParams(temperature=1.3, top_k=8), jax.random.key(3))
    rows = [r.prompt_ids + o.token_ids for r, o in zip(reqs, out)]
    ids, mask = left_padded(rows)
    width = ids.shape[1]
    logits = np.asarray(setup["model"](jnp.asarray(ids), jnp.asarray(mask)))
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    for b, (r, o) in enumerate(zip(reqs, out)):
        assert len(o.token_ids) == len(o.logprobs) == r.max_new_tokens
        start = width - len(o.token_ids)
        ref = logp[b, np.arange(start - 1, width - 1), o.token_ids]
        np.testing.assert_allclose(o.logprobs, ref, atol=1e-4, rtol=0)
        steps = logits[b, np.arange(start - 1, width - 1)]  # top-k: only the 8 best were possible
        assert np.all(
            steps[np.arange(len(o.token_ids)), o.token_ids] >= np.sort(steps, axis=-1)[:, -8] - 1e-5
        )
        assert np.all(np.asarray(o.logprobs) < 0)


def test_scored_prompt_tokens_equal_the_training_forward(setup, plain):
    """A request's last prompt tokens scored in the prefill (the tokens a caller forced) are the training
    forward's log-probs of them (`logprobs.token_logprobs` of the left-padded prompts), in one batch of
    prompts of four lengths scoring several tokens, all but the first (a request that only scores: no
    new token) and none; the sampled tokens stay those of a call that scores nothing."""
    p = setup["prompts"]  # 3, 16, 5 and 1 tokens
    reqs = [SampleRequest(p[0], 6, score_tokens=2), SampleRequest(p[1], 0, score_tokens=len(p[1]) - 1),
            SampleRequest(p[2], 5), SampleRequest(p[3], 4)]  # fmt: skip
    out = plain.generate(setup["params"], reqs, SamplingParams(greedy=True), jax.random.key(0))
    ids, mask = left_padded([r.prompt_ids for r in reqs])
    logits = setup["model"](jnp.asarray(ids), jnp.asarray(mask))
    ref, _ = token_logprobs(logits, jnp.asarray(ids))
    for b, (r, o) in enumerate(zip(reqs, out)):
        assert len(o.prompt_logprobs) == r.score_tokens
        if r.score_tokens:
            np.testing.assert_allclose(o.prompt_logprobs, ref[b, -r.score_tokens :], atol=1e-4, rtol=0)
    assert (out[1].token_ids, out[1].text, out[1].finish_reason) == ([], "", "length")
    unscored = [dataclasses.replace(r, score_tokens=0, max_new_tokens=r.max_new_tokens or 1) for r in reqs]
    again = plain.generate(setup["params"], unscored, SamplingParams(greedy=True), jax.random.key(0))
    for r, o, a in zip(reqs, out, again):
        assert o.token_ids == a.token_ids[: r.max_new_tokens] and a.prompt_logprobs == []
        np.testing.assert_allclose(o.logprobs, a.logprobs[: r.max_new_tokens], atol=1e-5, rtol=0)


def test_scoring_asks_for_tokens_that_have_a_predictor(setup, plain):
    p = setup["prompts"][0]
    for bad, msg in ((SampleRequest(p, 4, score_tokens=len(p)), "score_tokens must be in \\[0, 2\\]"),
                     (SampleRequest(p, 0), "max_new_tokens=0 must score some prompt tokens")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            plain.generate(setup["params"], [bad], SamplingParams(greedy=True), jax.random.key(0))


def test_prefill_and_decode_seconds_are_parts_of_the_call(setup, plain):
    """The seconds a call adds to `seconds` (prefill, decode) are those two phases only, both within
    the call's own wall time."""
    before = dict(plain.seconds)
    reqs = [SampleRequest(p, 6 + i) for i, p in enumerate(setup["prompts"])]
    start = time.perf_counter()
    plain.generate(setup["params"], reqs, SamplingParams(temperature=0.8), jax.random.key(5))
    wall = time.perf_counter() - start
    spent = {k: v - before[k] for k, v in plain.seconds.items()}
    assert set(spent) == {"prefill", "decode"}
    assert min(spent.values()) >= 0 and sum(spent.values()) <= wall


def test_compiles_once_per_bucket_and_not_for_new_weights(setup):
    tok, cfg = setup["tok"], setup["cfg"]
    sampler = Sampler(setup["graphdef"], cfg, tok, eos_ids=(), batch_buckets=(4,), prompt_buckets=(16, 32))
    ids = tok.encode(TEXTS[0])
    params = setup["params"]
    sampler.generate(params, [SampleRequest(ids[:3], 5)], SamplingParams(greedy=True), jax.random.key(0))
    once = sampler.num_compilations
    assert once > 0
    for n in range(4, 14):  # prompt lengths 4..13, 1-4 rows, 1-8 new tokens, fresh weights each call
        params = jax.tree.map(lambda x: x * 1.01, params)
        reqs = [SampleRequest(ids[k : k + n], 1 + (n + k) % 8) for k in range(1 + n % 4)]
        out = sampler.generate(params, reqs, SamplingParams(greedy=True), jax.random.key(n))
        assert [len(o.token_ids) for o in out] == [r.max_new_tokens for r in reqs]
    assert sampler.num_compilations == once
    sampler.generate(params, [SampleRequest(ids[:20], 5)], SamplingParams(greedy=True), jax.random.key(0))
    assert sampler.num_compilations > once  # prompt bucket 32 is a new program
    before = sampler.num_compilations
    many = [SampleRequest(ids[k : k + 5], 6) for k in range(6)]  # more rows than the largest bucket
    chunked = sampler.generate(params, many, SamplingParams(greedy=True), jax.random.key(0))
    alone = [sampler.generate(params, [r], SamplingParams(greedy=True), jax.random.key(0))[0] for r in many]
    assert [o.token_ids for o in chunked] == [o.token_ids for o in alone]
    assert sampler.num_compilations == before  # chunks of 4 and 2 rows both use the 4-row bucket


def _stop_inside(tok, ids: list[int], j: int) -> str:
    """A stop string that starts two tokens before token j and ends inside token j's text."""
    start = len(tok.decode(ids[: j - 2]))
    cut = len(tok.decode(ids[:j])) + 1
    return tok.decode(ids)[start:cut]


def _expected_cut(tok, ids: list[int], stops: tuple[str, ...]) -> tuple[int, str]:
    """Plain-Python reference: fewest tokens whose text contains a stop, and the text up to its end."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
        ends = [text.find(s) + len(s) for s in stops if s in text]
        if ends:
            return k, text[: min(ends)]
    raise AssertionError("stop never occurs")


def test_stop_strings_cut_exactly_and_rows_stop_independently(setup, plain, greedy_run):
    tok, prompts = setup["tok"], setup["prompts"]
    full = [r.token_ids for r in greedy_run]
    j0 = next(j for j in range(4, 12) if len(tok.decode([full[0][j]])) >= 2)
    stop0 = (_stop_inside(tok, full[0], j0),)
    late = tok.decode(full[2][10:13])
    stop2 = (late, _stop_inside(tok, full[2], 6), "\x00never")
    reqs = [
        SampleRequest(prompts[0], 16, stop=stop0, role="agent"),
        SampleRequest(prompts[1], 9, stop=("\x00never",), role="predictor"),
        SampleRequest(prompts[2], 16, stop=stop2, role="analyst"),
        SampleRequest(prompts[3], 16),
    ]
    out = plain.generate(setup["params"], reqs, SamplingParams(greedy=True), jax.random.key(0))
    for b in (0, 2):
        n, text = _expected_cut(tok, full[b], reqs[b].stop)
        assert out[b].finish_reason == "stop"
        assert out[b].token_ids == full[b][:n] and len(out[b].logprobs) == n
        assert out[b].text == text and text.endswith(tuple(reqs[b].stop))
    assert len(out[0].token_ids) == j0 + 1  # completed inside token j0: the text stops mid-token
    assert len(tok.decode(out[0].token_ids)) > len(out[0].text)
    assert (out[1].finish_reason, out[1].token_ids) == ("length", full[1][:9])
    assert (out[3].finish_reason, out[3].token_ids) == ("length", full[3])
    assert [o.role for o in out] == ["agent", "predictor", "analyst", "agent"]


def test_stop_string_in_prompt_does_not_fire(setup, plain, greedy_run):
    prompt = setup["prompts"][1]
    stop = setup["tok"].decode(prompt[-3:])
    if stop in setup["tok"].decode(greedy_run[1].token_ids):
        pytest.skip("the stop also occurs in the generated text")
    out = plain.generate(setup["params"], [SampleRequest(prompt, 16, stop=(stop,))], SamplingParams(greedy=True),
                         jax.random.key(0))  # fmt: skip
    assert (out[0].finish_reason, out[0].token_ids) == ("length", greedy_run[1].token_ids)


def test_eos_stops_a_row_and_is_kept_in_ids_not_text(setup, greedy_run):
    full = greedy_run[0].token_ids
    eos = full[5]
    first = full.index(eos)
    sampler = Sampler(setup["graphdef"], setup["cfg"], setup["tok"], eos_ids=(eos,), prompt_buckets=(16, 64))
    reqs = [SampleRequest(p, 16) for p in setup["prompts"][:2]]
    out = sampler.generate(setup["params"], reqs, SamplingParams(greedy=True), jax.random.key(0))
    assert out[0].finish_reason == "eos"
    assert out[0].token_ids == full[: first + 1]
    assert out[0].text == setup["tok"].decode(full[:first])
    other = greedy_run[1].token_ids
    if eos in other:
        assert (out[1].finish_reason, out[1].token_ids) == ("eos", other[: other.index(eos) + 1])
    else:
        assert (out[1].finish_reason, out[1].token_ids) == ("length", other)


def test_sharded_mesh_gives_the_same_greedy_tokens(setup, greedy_run):
    from roleagent_jax.parallel.sharding import make_mesh

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    model, cfg = load_pretrained(setup["path"], mesh=mesh)
    graphdef, params = nnx.split(model)
    sampler = Sampler(graphdef, cfg, setup["tok"], mesh, eos_ids=(), prompt_buckets=(16, 32, 64))
    reqs = [SampleRequest(p, 16) for p in setup["prompts"]]
    out = sampler.generate(params, reqs, SamplingParams(greedy=True), jax.random.key(0))
    assert [o.token_ids for o in out] == [r.token_ids for r in greedy_run]
    np.testing.assert_allclose(
        np.concatenate([o.logprobs for o in out]), np.concatenate([r.logprobs for r in greedy_run]), atol=1e-5
    )
    full = greedy_run[2].token_ids  # stops are matched per row on the sharded batch too
    reqs[2] = SampleRequest(setup["prompts"][2], 16, stop=(_stop_inside(setup["tok"], full, 7),))
    reqs[1] = SampleRequest(setup["prompts"][1], 5, stop=("\x00never",))
    out = sampler.generate(params, reqs, SamplingParams(greedy=True), jax.random.key(0))
    n, text = _expected_cut(setup["tok"], full, reqs[2].stop)
    assert (out[2].finish_reason, out[2].token_ids, out[2].text) == ("stop", full[:n], text)
    assert (out[1].finish_reason, out[1].token_ids) == ("length", greedy_run[1].token_ids[:5])
    assert out[0].token_ids == greedy_run[0].token_ids


def test_sampling_is_seeded_and_truncations_reduce_to_greedy(setup, plain, greedy_run):
    reqs = [SampleRequest(p, 16) for p in setup["prompts"]]
    params = setup["params"]
    warm = SamplingParams(temperature=1.0)
    a = plain.generate(params, reqs, warm, jax.random.key(7))
    b = plain.generate(params, reqs, warm, jax.random.key(7))
    c = plain.generate(params, reqs, warm, jax.random.key(8))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    assert [o.token_ids for o in a] != [o.token_ids for o in greedy_run]
    want = [o.token_ids for o in greedy_run]
    for sp in (
        SamplingParams(top_k=1),
        SamplingParams(temperature=0.7, top_p=1e-6),
        SamplingParams(temperature=0.0),
    ):
        assert [o.token_ids for o in plain.generate(params, reqs, sp, jax.random.key(1))] == want, sp


def test_token_bytes_reassemble_the_text(setup):
    tok = setup["tok"]
    pieces = stops_lib.token_bytes(tok, setup["cfg"].vocab_size + 3)
    assert pieces[-1] == b""
    for text in TEXTS:
        assert b"".join(pieces[i] for i in tok.encode(text)) == text.encode()


def test_matcher_agrees_with_python_search():
    """The in-loop byte matcher fires exactly at the token where Python's str search first succeeds."""
    rng = np.random.default_rng(0)
    alphabet = b"ab<>/"
    pieces = [bytes(rng.choice(list(alphabet), size=rng.integers(1, 5))) for _ in range(40)]
    table, lengths = stops_lib.byte_table(pieces)
    stops = [("ab/",), ("<a", "b>b"), ("/>", "aaaa", "b"), ()]
    stop_bytes, stop_len = stops_lib.encode_stops(stops, 4, 8)
    window = jnp.full((4, stops_lib.window_width(8, table.shape[1])), stops_lib.EMPTY, jnp.int32)
    seqs = rng.integers(0, len(pieces), size=(4, 30))
    fired = [None] * 4
    for t in range(30):
        ids = seqs[:, t]
        window, hit = stops_lib.append_and_match(
            window,
            jnp.asarray(table[ids]),
            jnp.asarray(lengths[ids]),
            jnp.asarray(stop_bytes),
            jnp.asarray(stop_len),
        )
        for b in range(4):
            if hit[b] and fired[b] is None:
                fired[b] = t
    for b in range(4):
        data = [b"".join(pieces[i] for i in seqs[b, : t + 1]) for t in range(30)]
        want = next((t for t in range(30) if stops_lib.first_stop_end(data[t], stops[b]) is not None), None)
        assert fired[b] == want


def test_bad_requests_raise_clear_errors(setup, plain):
    params, sp, key = setup["params"], SamplingParams(greedy=True), jax.random.key(0)
    with pytest.raises(ValueError, match="empty prompt"):
        plain.generate(params, [SampleRequest([], 4)], sp, key)
    with pytest.raises(ValueError, match="max_new_tokens"):
        plain.generate(params, [SampleRequest([1, 2], 10_000)], sp, key)
    with pytest.raises(ValueError, match="prompt length"):
        plain.generate(params, [SampleRequest([1] * 65, 4)], sp, key)
    with pytest.raises(ValueError, match="stop"):
        plain.generate(params, [SampleRequest([1, 2], 4, stop="</action>")], sp, key)
    with pytest.raises(ValueError, match="prompt ids"):
        plain.generate(params, [SampleRequest([1, 10_000], 4)], sp, key)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_fast_argmax_matches_numpy_including_ties():
    from roleagent_jax.sampling.choose import argmax_last

    x = np.random.default_rng(1).integers(0, 5, size=(64, 300)).astype(np.float32)  # many ties
    x[3] = -np.inf
    x[4, 7] = np.inf
    np.testing.assert_array_equal(np.asarray(argmax_last(jnp.asarray(x))), np.argmax(x, axis=-1))


def test_capped_batch_buckets():
    from roleagent_jax.sampling import BATCH_BUCKETS, capped_batch_buckets

    assert capped_batch_buckets(0) == BATCH_BUCKETS
    assert capped_batch_buckets(64) == (8, 16, 32, 48, 64)
    assert capped_batch_buckets(100) == (8, 16, 32, 48, 64, 96, 100)
    assert capped_batch_buckets(4) == (4,)
    with pytest.raises(ValueError, match="max_rows_per_call"):
        capped_batch_buckets(-1)


def test_background_rows_pause_when_the_rest_end_and_continue_exactly(setup, plain, greedy_run):
    prompts, params, greedy = setup["prompts"], setup["params"], SamplingParams(greedy=True)
    reqs = [SampleRequest(prompts[0], 5), SampleRequest(prompts[1], 16, background=True)]
    out = plain.generate(params, reqs, greedy, jax.random.key(0))
    assert out[0].token_ids == greedy_run[0].token_ids[:5] and out[0].finish_reason == "length"
    paused = out[1]
    assert paused.finish_reason == "paused" and paused.token_ids == greedy_run[1].token_ids[:5]
    # The next call continues it from its prompt plus those tokens; alone, it runs to its budget.
    more = SampleRequest(prompts[1] + paused.token_ids, 11, background=True)
    rest = plain.generate(params, [more], greedy, jax.random.key(1))[0]
    assert rest.finish_reason == "length"
    assert paused.token_ids + rest.token_ids == greedy_run[1].token_ids
    np.testing.assert_allclose(paused.logprobs + rest.logprobs, greedy_run[1].logprobs, atol=1e-5)


def test_waiting_background_rows_run_in_chunks_of_the_last_foreground_shape(setup, greedy_run):
    """After a call with foreground rows in the 8-row bucket, a call of only background rows (what waits
    after a rollout's last agent step) runs in 8-row chunks in the plain layout, even for 11 grouped
    rows that alone would take the 16-row bucket: it compiles nothing new, and each row's greedy tokens
    are those it gives alone."""
    prompts, params, greedy = setup["prompts"], setup["params"], SamplingParams(greedy=True)
    sampler = Sampler(setup["graphdef"], setup["cfg"], setup["tok"], eos_ids=(), prompt_buckets=(16, 32, 64))
    order = [i % len(prompts) for i in range(11)]
    waiting = [SampleRequest(prompts[i], 16, group=i, background=True) for i in order]
    sampler.generate(params, [SampleRequest(p, 16) for p in prompts * 2], greedy, jax.random.key(0))
    compiled = sampler.num_compilations
    out = sampler.generate(params, waiting, greedy, jax.random.key(0))
    assert sampler.num_compilations == compiled and sampler.last_layout is None
    assert [r.token_ids for r in out] == [greedy_run[i].token_ids for i in order]
    assert all(r.finish_reason == "length" for r in out)


def test_background_rows_take_only_idle_rows_of_the_bucket_and_wait_otherwise(setup, plain, greedy_run):
    """8 foreground rows fill the smallest bucket: a background row would double every step's rows, so
    it waits (paused, nothing generated); so does one whose prompt would widen the call, while one that
    fits decodes beside the foreground row, its budget capped at that row's (paused, not finished). The
    row that waited, run alone, gives exactly the tokens it would have."""
    prompts, params, greedy = setup["prompts"], setup["params"], SamplingParams(greedy=True)
    short = [prompts[0]] * 8
    full = [SampleRequest(p, 5) for p in short] + [SampleRequest(prompts[1], 16, background=True)]
    out = plain.generate(params, full, greedy, jax.random.key(0))
    assert all(r.token_ids == greedy_run[0].token_ids[:5] for r in out[:8])
    assert out[8].finish_reason == "paused" and out[8].token_ids == [] and out[8].role == "agent"

    assert len(prompts[0]) <= 16 < len(prompts[1]) + 16  # the prompt below is past the 16-token bucket
    wide = SampleRequest(prompts[1] + [prompts[1][-1]] * 16, 4, background=True)
    narrow = SampleRequest(prompts[3], 16, background=True)
    out = plain.generate(params, [SampleRequest(prompts[0], 5), wide, narrow], greedy, jax.random.key(0))
    assert out[1].finish_reason == "paused" and out[1].token_ids == []
    assert out[2].finish_reason == "paused" and out[2].token_ids == greedy_run[3].token_ids[:5]

    (alone,) = plain.generate(params, [full[8]], greedy, jax.random.key(1))
    assert alone.finish_reason == "length" and alone.token_ids == greedy_run[1].token_ids
