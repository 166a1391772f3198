"""One batched, jitted sampler for every role of the policy (agent, predictor, analyst).

A call takes requests of any prompt length and returns, per request, the generated ids, their
log-probs under the policy at temperature 1, the text and why generation ended; on request also the
log-probs of the prompt's last tokens (tokens the caller forced, e.g. a branch's opener), read off the
prefill's logits, so a forced token's old log-prob needs no forward pass of its own. Shapes are
rounded up to buckets (batch, prompt length, new tokens, stop-string sizes) so a long run compiles a
handful of programs; the weights are an argument of both jitted functions, so a new policy every
training step never recompiles. Prompts are left-padded so that every row writes its new token into
the same cache slot; per-row positions keep RoPE right.

Requests may declare a `group`: rows of one (role, group) share the longest common prefix of their
prompts, which is then prefilled once per group, stored once, and read once per group by every decode
step (`prefix.plan_layout` decides when this beats the plain layout; `qwen2.merge_attention` combines
the shared and per-row attentions exactly).

Before any model work, `plan.plan_call` decides from the requests alone which run now and in which
chunks (one prefill and decode loop each): a call is cut into chunks of similar prompt length when the
padded prefill that saves outweighs the extra decode loops under a cost model of the platform, so that
a few long prompts no longer pad every row of the call. Rows compute the same whatever their chunk;
background rows keep to the call's foreground rows across chunks (their chunk runs last).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from roleagent_jax.models import Qwen2Config, SharedPrefix, init_cache
from roleagent_jax.parallel import distributed
from roleagent_jax.sampling import stops as stops_lib
from roleagent_jax.sampling.choose import choose_tokens
from roleagent_jax.sampling.plan import (
    BATCH_BUCKETS,
    PROMPT_BUCKETS,
    Buckets,
    CallPlan,
    Chunk,
    cost_model,
    plan_call,
)
from roleagent_jax.sampling.prefix import PrefixLayout
from roleagent_jax.sampling.requests import FINISH_REASONS, SampleRequest, SampleResult, SamplingParams

_EOS, _STOP, _LENGTH, _PAUSED = 1, 2, 3, 4


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, n - 1).bit_length())


class Sampler:
    """Batched generation with a KV cache: jitted prefill, then one jitted `lax.while_loop` decode.

    `num_compilations` counts traces of the two jitted functions (one per new bucket shape or
    sampling mode); it stays flat across calls whose shapes fall in known buckets and across new weights.
    `seconds` adds up, over every call, the wall time of each chunk's prefill (until its logits are
    ready) and of its decode loop (until its tokens are on the host), so a caller can tell the model's
    time from the host's (planning, padding, detokenizing) by the difference over a call.
    With a mesh, rows are split over the ("data", "fsdp") axes, the cache follows
    `qwen2.cache_sharding` and the weights `sharding.param_shardings`; a shared-prefix call splits
    whole groups (their prefix cache beside their rows) the same way. `plan` shows how a call would
    run (chunks, shapes, padded positions); `last_layout` is the shared-prefix layout of the last chunk
    generated (None: it used the plain per-row layout).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        config: Qwen2Config,
        tokenizer,
        mesh: jax.sharding.Mesh | None = None,
        *,
        eos_ids: Sequence[int] | None = None,
        batch_buckets: Sequence[int] = BATCH_BUCKETS,
        prompt_buckets: Sequence[int] = PROMPT_BUCKETS,
        max_new_tokens_cap: int = 512,
        new_token_buckets: Sequence[int] | None = None,
        pad_id: int | None = None,
    ) -> None:
        self.graphdef = graphdef
        self.config = config
        self.tokenizer = tokenizer
        self.mesh = mesh
        if eos_ids is None:
            found = [getattr(tokenizer, "eos_token_id", None), config.eos_token_id]
            flat = [i for x in found for i in (x if isinstance(x, list | tuple) else [x])]
            eos_ids = [i for i in flat if i is not None]
        self.eos_ids = tuple(sorted({int(i) for i in eos_ids}))
        if pad_id is None:
            pad_id = getattr(tokenizer, "pad_token_id", None)
            pad_id = pad_id if pad_id is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.pad_id = int(pad_id)
        self.buckets = Buckets.make(
            batch_buckets,
            prompt_buckets,
            max_new_tokens_cap,
            new_token_buckets,
            row_multiple=1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"]),
        )
        self.max_new_tokens_cap = int(max_new_tokens_cap)
        platform = (jax.devices()[0] if mesh is None else mesh.devices.flat[0]).platform
        self.cost_model = cost_model(platform, config.matmul_weights)
        self.num_compilations = 0
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self.last_layout: PrefixLayout | None = None
        self._foreground_rows = 0  # batch rows of the last call that had a foreground request
        self._pieces: list[bytes] | None = None
        self._table: tuple[jax.Array, jax.Array] | None = None
        self._prefill = jax.jit(self._prefill_fn, static_argnames=("cache_len", "tail"))
        self._prefill_shared = jax.jit(self._prefill_shared_fn, static_argnames=("cache_len", "tail"))
        self._decode = jax.jit(self._decode_fn, static_argnames=("mode",), donate_argnames=("cache",))

    # ---------------------------------------------------------------- placement helpers
    def _constrain(self, x: jax.Array) -> jax.Array:
        """Keep a row-major array split over the batch axes inside the jitted programs."""
        if self.mesh is None:
            return x
        from roleagent_jax.parallel.sharding import batch_sharding

        return jax.lax.with_sharding_constraint(x, batch_sharding(self.mesh, x.ndim))

    def _constrain_cache(self, cache):
        if self.mesh is None:
            return cache
        from roleagent_jax.models.qwen2 import cache_sharding

        return jax.lax.with_sharding_constraint(cache, cache_sharding(self.mesh, self.config))

    def _constrain_prefix(self, prefix: SharedPrefix | None) -> SharedPrefix | None:
        """A shared prefix keeps its groups over the batch axes, like the rows that read it."""
        if prefix is None:
            return None
        return SharedPrefix(self._constrain_cache(prefix.cache), self._constrain(prefix.mask))

    def _put_rows(self, x: np.ndarray) -> jax.Array:
        if self.mesh is None:
            return jnp.asarray(x)
        from roleagent_jax.parallel.sharding import batch_sharding

        return jax.device_put(x, batch_sharding(self.mesh, x.ndim))

    def _put_replicated(self, x) -> jax.Array:
        if self.mesh is None:
            return jnp.asarray(x)
        return jax.device_put(x, NamedSharding(self.mesh, P()))

    def _place_params(self, params):
        if self.mesh is None:
            return params
        from roleagent_jax.parallel.sharding import param_shardings

        return jax.device_put(params, param_shardings(params, self.mesh))

    def _byte_table(self) -> tuple[jax.Array, jax.Array]:
        if self._table is None:
            self._pieces = stops_lib.token_bytes(self.tokenizer, self.config.vocab_size)
            table, lengths = stops_lib.byte_table(self._pieces)
            self._table = (self._put_replicated(table), self._put_replicated(lengths))
        return self._table

    # ---------------------------------------------------------------- jitted programs
    def _prefill_fn(self, params, ids, mask, *, cache_len: int, tail: int):
        """Run the whole (left-padded) prompt through the model, filling cache slots [0, P).

        Only the last ``tail`` slots' logits are needed: the last one starts generation, the others
        score the prompt's last ``tail - 1`` tokens (``SampleRequest.score_tokens``; ``tail`` is 1 when
        no row scores any). The prompt goes in as two calls, all but the last ``tail`` tokens and then
        those, so the unused logits of the first call are dead code that XLA drops: the vocabulary
        projection runs for ``tail`` positions per row instead of P. The cache is allocated once at its
        decoding size (no prompt-sized copy), since on accelerators it is the largest buffer of a
        rollout. Returns the last slot's logits, the cache and the scores ``[B, tail - 1]``.
        """
        self.num_compilations += 1
        model = nnx.merge(self.graphdef, params)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
        return self._fill(model, ids, mask, positions, cache_len, None, tail)

    def _prefill_shared_fn(
        self, params, prefix_ids, prefix_mask, ids, mask, offset, *, cache_len: int, tail: int
    ):
        """Prefill each group's shared prefix once (``[groups, prefix]``, left-padded, its own cache of
        exactly that many slots), then every row's own prompt suffix, positioned after its group's
        prefix (``offset`` tokens) and attending over it. Returns the prefill's logits, the rows' cache,
        the scores of ``_prefill_fn`` and the prefix (``SharedPrefix``), which decoding reads but never
        writes."""
        self.num_compilations += 1
        model = nnx.merge(self.graphdef, params)
        groups, span = prefix_ids.shape
        prefix_cache = self._constrain_cache(init_cache(self.config, groups, span))
        prefix_pos = jnp.maximum(jnp.cumsum(prefix_mask, axis=1) - 1, 0).astype(jnp.int32)
        _, prefix_cache = model.decode(
            prefix_ids, prefix_pos, prefix_cache, jnp.int32(0), prefix_mask.astype(bool), fresh=True
        )
        prefix = self._constrain_prefix(SharedPrefix(prefix_cache, prefix_mask.astype(bool)))
        positions = offset[:, None] + jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
        logits, cache, scores = self._fill(model, ids, mask, positions, cache_len, prefix, tail)
        return logits, cache, scores, prefix

    def _fill(self, model, ids, mask, positions, cache_len: int, prefix: SharedPrefix | None, tail: int):
        batch, plen = ids.shape
        cache = self._constrain_cache(init_cache(self.config, batch, cache_len))
        kv_mask = jnp.concatenate([mask.astype(bool), jnp.zeros((batch, cache_len - plen), bool)], axis=1)
        head = plen - tail
        if head:
            _, cache = model.decode(
                ids[:, :head], positions[:, :head], cache, jnp.int32(0), kv_mask, fresh=True, prefix=prefix
            )
        logits, cache = model.decode(
            ids[:, head:], positions[:, head:], cache, jnp.int32(head), kv_mask, prefix=prefix
        )
        # the training forward's log-prob (logprobs.token_logprobs): the raw float32 logits at t - 1
        # score token t, at temperature 1, as `choose_tokens` scores a sampled token
        given = logits[:, :-1].astype(jnp.float32)
        picked = jnp.take_along_axis(given, ids[:, head + 1 :, None], axis=-1)[..., 0]
        scores = self._constrain(picked - jax.nn.logsumexp(given, axis=-1))
        return self._constrain(logits[:, -1]), self._constrain_cache(cache), scores

    def _decode_fn(
        self,
        params,
        cache,
        logits,
        prompt_mask,
        max_new,
        background,
        follow,
        stop_bytes,
        stop_len,
        table,
        rng,
        knobs,
        eos,
        prefix,
        offset,
        *,
        mode,
    ):
        """Sample token 0 from the prefill logits, then feed/sample until every row is done.

        ``background`` rows decode only while a foreground row does: one of this chunk, or for the first
        ``follow`` steps one of the call's other chunks (their longest foreground response).
        ``prefix``/``offset``: the shared prefix and each row's count of its tokens (None: plain rows).
        Returns (tokens [B, N], logprobs [B, N], n_generated [B], finish code [B]) and the final cache.
        """
        self.num_compilations += 1
        greedy, top_k, use_top_p, new_tokens = mode
        batch, plen = prompt_mask.shape
        prompt_len = prompt_mask.sum(axis=1).astype(jnp.int32)
        if offset is not None:
            prompt_len = prompt_len + offset
        prefix = self._constrain_prefix(prefix)
        use_stops = stop_bytes is not None
        temperature, top_p = knobs[0], knobs[1]

        def choose(lg, step):
            key = jax.random.fold_in(rng, step)
            return choose_tokens(lg, key, temperature, top_p, greedy=greedy, top_k=top_k, use_top_p=use_top_p)

        def record(state, tok, logp, step):
            tokens, logps, done, finish, n_gen, window = state
            live = ~done
            tok = jnp.where(live, tok, self.pad_id)
            tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, step))
            logps = jax.lax.dynamic_update_slice(logps, jnp.where(live, logp, 0.0)[:, None], (0, step))
            is_eos = jnp.any(tok[:, None] == eos[None, :], axis=1)
            if use_stops:
                window, hit = stops_lib.append_and_match(
                    window, table[0][tok], table[1][tok], stop_bytes, stop_len
                )
            else:
                hit = jnp.zeros_like(done)
            code = jnp.where(is_eos, _EOS, jnp.where(hit, _STOP, jnp.where(step + 1 >= max_new, _LENGTH, 0)))
            ends = live & (code > 0)
            finish = jnp.where(ends, code, finish)
            n_gen = jnp.where(ends, step + 1, n_gen)
            return (tokens, logps, done | ends, finish, n_gen, window), tok

        width = stops_lib.window_width(stop_bytes.shape[2], table[0].shape[1]) if use_stops else 1
        state = (
            self._constrain(jnp.full((batch, new_tokens), self.pad_id, jnp.int32)),
            self._constrain(jnp.zeros((batch, new_tokens), jnp.float32)),
            max_new <= 0,
            jnp.zeros((batch,), jnp.int32),
            jnp.zeros((batch,), jnp.int32),
            self._constrain(jnp.full((batch, width), stops_lib.EMPTY, jnp.int32)),
        )
        tok, logp = choose(logits, 0)
        state, tok = record(state, tok, logp, 0)

        def keep_going(carry):
            step, _, _, state = carry
            done = state[2]
            others = (step < follow) & ~jnp.all(done)
            return (step < new_tokens) & (~jnp.all(done | background) | others)

        def one_token(carry):
            step, last, cache, state = carry
            model = nnx.merge(self.graphdef, params)
            slot = plen + step - 1  # where the previous token goes
            positions = (prompt_len + step - 1)[:, None]
            kv_mask = jnp.concatenate(
                [
                    prompt_mask.astype(bool),
                    jnp.broadcast_to(jnp.arange(new_tokens) < step, (batch, new_tokens)),
                ],
                axis=1,
            )
            lg, cache = model.decode(
                last[:, None], positions, cache, slot, self._constrain(kv_mask), prefix=prefix
            )
            tok, logp = choose(lg[:, 0], step)
            state, tok = record(state, tok, logp, step)
            return step + 1, tok, self._constrain_cache(cache), state

        carry = (jnp.int32(1), tok, cache, state)
        steps, _, cache, state = jax.lax.while_loop(keep_going, one_token, carry)
        tokens, logps, done, finish, n_gen, _ = state
        finish = jnp.where(max_new <= 0, _LENGTH, finish)  # a request that only scores its prompt
        finish = jnp.where(done, finish, _PAUSED)  # only background rows can stop unfinished
        n_gen = jnp.where(done, n_gen, steps)
        # The cache is returned (and dropped by the caller) so the donated input buffer can alias it:
        # the loop then updates the prefill's cache in place instead of copying it first.
        return (tokens, logps, n_gen, finish), cache

    # ---------------------------------------------------------------- public API
    def plan(self, requests: Sequence[SampleRequest]) -> CallPlan:
        """How `generate` would run ``requests`` now (`plan.plan_call`): its chunks and their shapes."""
        return plan_call(requests, self.buckets, self.cost_model, self._foreground_rows)

    def generate(
        self,
        params,
        requests: Sequence[SampleRequest],
        params_sampling: SamplingParams,
        rng: jax.Array,
    ) -> list[SampleResult]:
        """Generate for every request (results in request order), in the chunks of `plan`: one chunk
        when it holds every request, else consecutive runs of requests (sharing groups whole) or runs of
        similar prompt length, whichever costs less; each chunk with its own key folded from `rng`. A
        call of only background requests runs in the plain layout, in chunks of at most the batch rows
        of the last call that had a foreground request."""
        if not requests:
            return []
        for r in requests:
            self._validate(r)
        params = self._place_params(params)
        plan = self.plan(requests)
        results: list[SampleResult | None] = [None] * len(requests)
        for i in plan.waiting:
            results[i] = SampleResult([], [], "", "paused", requests[i].role)
        follow = None if all(r.background for r in requests) else 0
        for c, chunk in enumerate(plan.chunks):
            key = rng if c == 0 else jax.random.fold_in(rng, c)
            todo = [plan.requests[i] for i in chunk.requests]
            out = self._generate_chunk(params, todo, chunk, params_sampling, key, follow)
            for r, res in zip(todo, out, strict=True):
                if follow is not None and not r.background:
                    follow = max(follow, len(res.token_ids))
            for i, res in zip(chunk.requests, out, strict=True):
                if res.finish_reason == "length" and len(res.token_ids) < requests[i].max_new_tokens:
                    res = replace(res, finish_reason="paused")
                results[i] = res
        self._foreground_rows = plan.foreground_rows or self._foreground_rows
        return results

    def _validate(self, r: SampleRequest) -> None:
        if len(r.prompt_ids) == 0:
            raise ValueError("a request has an empty prompt: give at least one token id")
        lo, hi = min(r.prompt_ids), max(r.prompt_ids)
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"prompt ids must lie in [0, {self.config.vocab_size}), got min {lo} max {hi}")
        if not 0 <= r.max_new_tokens <= self.max_new_tokens_cap:
            raise ValueError(
                f"max_new_tokens must be in [0, {self.max_new_tokens_cap}] (the sampler's max_new_tokens_cap), "
                f"got {r.max_new_tokens}"
            )
        if not 0 <= r.score_tokens < len(r.prompt_ids):
            raise ValueError(
                f"score_tokens must be in [0, {len(r.prompt_ids) - 1}] (the prompt's tokens after its first, "
                f"which nothing predicts), got {r.score_tokens}"
            )
        if not (r.max_new_tokens or r.score_tokens):
            raise ValueError("a request with max_new_tokens=0 must score some prompt tokens (score_tokens)")
        if isinstance(r.stop, str) or any(not isinstance(s, str) or not s for s in r.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {r.stop!r}")
        try:
            hash(r.group)
        except TypeError:
            raise ValueError(f"group must be hashable (e.g. the task group's id), got {r.group!r}") from None

    def _generate_chunk(
        self, params, requests, chunk: Chunk, sp: SamplingParams, rng, follow: int | None
    ) -> list[SampleResult]:
        """Generate ``requests`` (the chunk's, in its row order) in ``chunk``'s shapes. ``follow``: None
        when the call has no foreground request (background rows run to their end), else the longest
        response of the foreground rows already generated in the call's other chunks."""
        n = len(requests)
        plen, new_tokens, layout = chunk.prompt_bucket, chunk.new_tokens, chunk.layout
        self.last_layout = layout
        if layout is None:
            slots = np.concatenate([np.arange(n), np.full(chunk.batch - n, -1)])
            skip = np.zeros(chunk.batch, np.int64)  # prompt tokens a row leaves to a shared prefix
        else:
            slots, skip = layout.slots, layout.row_prefix_len()
        rows = len(slots)

        ids = np.full((rows, plen), self.pad_id, np.int32)
        mask = np.zeros((rows, plen), np.int32)
        max_new = np.zeros((rows,), np.int32)
        background = np.zeros((rows,), bool)
        for b, s in enumerate(slots):
            own = requests[s].prompt_ids[skip[b] :] if s >= 0 else [self.pad_id]  # idle: one real token
            ids[b, plen - len(own) :], mask[b, plen - len(own) :] = own, 1
            max_new[b] = requests[s].max_new_tokens if s >= 0 else 0
            background[b] = follow is not None and s >= 0 and requests[s].background

        n_stop = max(len(r.stop) for r in requests)
        if n_stop:
            widest = max(len(s.encode("utf-8")) for r in requests for s in r.stop)
            stop_bytes, stop_len = stops_lib.encode_stops(
                [requests[s].stop if s >= 0 else () for s in slots],
                _pow2_at_least(n_stop),
                _pow2_at_least(widest, 8),
            )
            stop_bytes, stop_len, table = (
                self._put_rows(stop_bytes),
                self._put_rows(stop_len),
                self._byte_table(),
            )
        else:
            stop_bytes = stop_len = table = None

        greedy = sp.is_greedy
        top_k = 0 if greedy else min(int(sp.top_k), self.config.vocab_size)
        mode = (greedy, top_k, (not greedy) and sp.top_p < 1.0, new_tokens)
        knobs = self._put_replicated(np.array([max(sp.temperature, 1e-6), sp.top_p], np.float32))
        eos = self._put_replicated(np.array(self.eos_ids or [-1], np.int32))
        prompt_mask = self._put_rows(mask)
        cache_len = plen + new_tokens
        # the prefill's scored columns, in few shapes: the most tokens a row scores plus the last slot
        scored = max(r.score_tokens for r in requests)
        tail = min(plen, _pow2_at_least(scored + 1, 8)) if scored else 1
        start = time.perf_counter()
        if layout is None:
            prefix = offset = None
            logits, cache, scores = self._prefill(
                params, self._put_rows(ids), prompt_mask, cache_len=cache_len, tail=tail
            )
        else:
            prefix_ids, prefix_mask = self._prefix_arrays(requests, layout)
            offset = self._put_rows(skip.astype(np.int32))
            logits, cache, scores, prefix = self._prefill_shared(
                params, prefix_ids, prefix_mask, self._put_rows(ids), prompt_mask, offset,
                cache_len=cache_len, tail=tail,
            )  # fmt: skip
        jax.block_until_ready(logits)  # the prefill's time ends with its work, before the decode is sent
        prefilled = time.perf_counter()
        self.seconds["prefill"] += prefilled - start
        out = self._decode(
            params, cache, logits, prompt_mask, self._put_rows(max_new), self._put_rows(background),
            self._put_replicated(np.int32(follow or 0)), stop_bytes, stop_len, table,
            self._put_replicated(rng), knobs, eos, prefix, offset, mode=mode,
        )  # fmt: skip
        tokens, logps, n_gen, finish = distributed.fetch(out[0])  # rows of every process
        self.seconds["decode"] += time.perf_counter() - prefilled
        scores = distributed.fetch(scores) if scored else None
        results: list[SampleResult | None] = [None] * n
        for b, s in enumerate(slots):
            if s >= 0:
                res = self._result(requests[s], tokens[b, : n_gen[b]], logps[b, : n_gen[b]], int(finish[b]))
                if requests[s].score_tokens:
                    res.prompt_logprobs = [float(x) for x in scores[b, tail - 1 - requests[s].score_tokens :]]
                results[s] = res
        return results

    def _prefix_arrays(self, requests, layout: PrefixLayout) -> tuple[jax.Array, jax.Array]:
        """Each grid group's shared prefix, left-padded to the prefix bucket (empty groups all pad)."""
        ids = np.full((layout.groups, layout.prefix_bucket), self.pad_id, np.int32)
        mask = np.zeros((layout.groups, layout.prefix_bucket), np.int32)
        first = layout.slots.reshape(layout.groups, layout.rows_per_group)[:, 0]
        for g, (s, share) in enumerate(zip(first, layout.prefix_len, strict=True)):
            if share:
                ids[g, layout.prefix_bucket - share :] = requests[s].prompt_ids[:share]
                mask[g, layout.prefix_bucket - share :] = 1
        return self._put_rows(ids), self._put_rows(mask)

    def _result(self, r: SampleRequest, ids: np.ndarray, logps: np.ndarray, code: int) -> SampleResult:
        ids_list = [int(t) for t in ids]
        reason = FINISH_REASONS[code]
        shown = ids_list[:-1] if reason == "eos" else ids_list
        text = self.tokenizer.decode(shown, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if reason == "stop":
            end = stops_lib.first_stop_end_text(text, r.stop)
            if end is None:  # the tokenizer's text disagrees with its raw bytes: cut the bytes instead
                assert self._pieces is not None
                data = b"".join(self._pieces[t] for t in ids_list)
                end_b = stops_lib.first_stop_end(data, r.stop)
                text = data[:end_b].decode("utf-8", errors="replace") if end_b is not None else text
            else:
                text = text[:end]
        return SampleResult(ids_list, [float(x) for x in logps], text, reason, r.role)
