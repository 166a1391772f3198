"""Qwen2 decoder in Flax NNX: full-sequence forward for training and a KV-cache step for sampling.

Weights keep head structure explicit (q kernel ``[hidden, heads, head_dim]``, o kernel
``[heads, head_dim, hidden]``) so sharding rules can split heads over the ``tensor`` axis and the
KV cache shares the same layout. With ``scan_layers`` all blocks live in one module whose params have
a leading ``[layers]`` dimension, and the layer loop is a ``lax.scan``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from roleagent_jax.models.config import Qwen2Config
from roleagent_jax.models.lora import LoRAParam, stacked_adapter_layers
from roleagent_jax.parallel.sharding import BATCH_AXES

_MAX_CHUNKS = 16
_FEW_QUERIES = 4
_NEG = -1e30  # finite so fully-masked (padding) query rows give a uniform softmax instead of NaN


class KVCache(NamedTuple):
    """Keys and values of every layer, each ``[batch, kv_heads, slots, head_dim]``.

    Slots sit next to head_dim so that each (row, KV head) is one contiguous ``[slots, head_dim]`` matrix
    that the decode step's attention reads as a batched matmul operand. Unscanned layers keep one array
    per layer (``k`` and ``v`` are tuples): the attention dot then reads its layer's buffer in place,
    where slicing a stacked array made XLA copy every layer's cache on every decode step. Scanned layers
    keep one stacked ``[layers, ...]`` array, the scan's carry."""

    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]

    @property
    def slots(self) -> int:
        return jax.tree.leaves(self.k)[0].shape[-2]


class SharedPrefix(NamedTuple):
    """Prompt heads shared by groups of rows, each stored once: ``cache`` is laid out like a KVCache
    with one ``[groups, kv_heads, prefix_slots, head_dim]`` entry per layer, ``mask`` bool
    ``[groups, prefix_slots]`` marks real slots. Rows are group-major: with ``B`` rows, row ``b`` reads
    group ``b // (B // groups)``. A group whose mask is all false is an empty prefix."""

    cache: KVCache
    mask: jax.Array


def init_cache(config: Qwen2Config, batch: int, max_len: int, dtype=None) -> KVCache:
    """An all-zero cache with ``max_len`` slots per row (compute dtype unless given)."""
    shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
    dt = jnp.dtype(dtype or config.dtype)
    if config.scan_layers:
        stacked = (config.num_hidden_layers, *shape)
        return KVCache(jnp.zeros(stacked, dt), jnp.zeros(stacked, dt))
    layers = range(config.num_hidden_layers)
    return KVCache(tuple(jnp.zeros(shape, dt) for _ in layers), tuple(jnp.zeros(shape, dt) for _ in layers))


def cache_sharding(mesh: Mesh, config: Qwen2Config) -> KVCache:
    """KVCache of shardings matching ``init_cache(config, ...)``: each layer's ``[batch, kv_heads, slots,
    head_dim]`` array (one stacked array behind a replicated ``layers`` dim when layers are scanned) has
    batch over ``(data, fsdp)`` and KV heads over ``tensor``, replicated when the KV heads do not divide."""
    heads = None if config.num_key_value_heads % mesh.shape["tensor"] else "tensor"
    if config.scan_layers:
        stacked = NamedSharding(mesh, P(None, BATCH_AXES, heads, None, None))
        return KVCache(stacked, stacked)
    per_layer = (NamedSharding(mesh, P(BATCH_AXES, heads, None, None)),) * config.num_hidden_layers
    return KVCache(per_layer, per_layer)


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> nnx.Param:
    return nnx.Param(0.02 * jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype))


class Embedding(nnx.Module):
    def __init__(self, vocab: int, hidden: int, param_dtype, rngs: nnx.Rngs):
        self.embedding = _normal(rngs, (vocab, hidden), param_dtype)


class RMSNorm(nnx.Module):
    def __init__(self, size: int, eps: float, param_dtype, dtype):
        self.scale = nnx.Param(jnp.ones((size,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        # Statistics in float32 whatever the compute dtype (as the reference implementation does).
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * x32.astype(self.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos/sin ``[B, T, head_dim]`` for per-row positions (half-split rotation layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x`` ``[B, T, heads, head_dim]``; computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention without repeating K/V.

    q ``[B, T, N, D]``, k/v ``[B, KV, S, D]`` (the cache layout), mask bool ``[B, T, S]`` -> ``[B, T, N, D]``.
    Query head ``h`` reads KV head ``h // (N // KV)``, matching the Hugging Face head order. The softmax
    normalisation is applied after mixing the values, on ``[B, T, N, D]`` instead of the larger
    ``[B, N, T, S]`` probabilities (one fewer pass over the biggest tensor, forward and backward).
    """
    out, _, total = attention_partials(q, k, v, mask)
    out = out / total[..., None]
    return out.astype(q.dtype).reshape(q.shape)


def _dot_operands(*xs: jax.Array) -> tuple[jax.Array, ...]:
    """Operands for a dot with float32 output. XLA:CPU has no kernel for a bf16 x bf16 -> f32 dot that
    it leaves unfused (whole-sequence logits, chunked attention: UNIMPLEMENTED when run), so on a CPU
    low-precision operands are widened to float32 first: the same products and float32 sums. The
    barrier keeps XLA from folding the widening back into the dot."""
    if jax.default_backend() != "cpu" or all(x.dtype == jnp.float32 for x in xs):
        return xs
    return jax.lax.optimization_barrier(tuple(x.astype(jnp.float32) for x in xs))


def attention_partials(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention over one block of keys, left un-normalised so blocks can be merged exactly.

    Shapes as ``grouped_attention``. Returns float32 ``(out [B, T, KV, G, D], top [B, T, KV, G],
    total [B, T, KV, G])``: ``out`` is ``sum_s exp(score_s - top) v_s`` and ``total`` is
    ``sum_s exp(score_s - top)`` over the visible keys, ``top`` their largest score.
    """
    b, t, n, d = q.shape
    kv = k.shape[1]
    qg, k = _dot_operands(q.reshape(b, t, kv, n // kv, d), k)
    if t <= _FEW_QUERIES:
        # Decode steps: the cache is the dot's left operand in its stored layout (batch dims leading,
        # [S, D] contiguous), so it is read once, unmoved; the scores transposed after are tiny.
        dims = (((3,), (4,)), ((0, 1), (0, 2)))  # contract head_dim; batch over (B, KV)
        scores = jax.lax.dot_general(k, qg, dims, preferred_element_type=jnp.float32)  # [B,KV,S,T,G]
        scores = jnp.transpose(scores, (0, 1, 4, 3, 2))
    else:
        scores = jnp.einsum("btkgd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None, :, :], scores * (1.0 / math.sqrt(d)), _NEG)
    top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))  # softmax is shift-invariant
    weights = jnp.exp(scores - top)
    total = jnp.sum(weights, axis=-1)  # [B, KV, G, T]
    weights, v = _dot_operands(weights.astype(v.dtype), v)
    if t <= _FEW_QUERIES:
        dims = (((4,), (2,)), ((0, 1), (0, 1)))  # contract slots; batch over (B, KV)
        out = jax.lax.dot_general(weights, v, dims, preferred_element_type=jnp.float32)
        out = jnp.transpose(out, (0, 3, 1, 2, 4))  # [B,KV,G,T,D] -> [B,T,KV,G,D]
    else:
        out = jnp.einsum("bkgts,bksd->btkgd", weights, v, preferred_element_type=jnp.float32)
    return out, jnp.transpose(top[..., 0], (0, 3, 1, 2)), jnp.transpose(total, (0, 3, 1, 2))


def prefix_attention_partials(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``attention_partials`` against prefixes that groups of consecutive rows share.

    q ``[B, T, N, D]`` with rows group-major (row ``b`` belongs to group ``b // (B // G)``); k/v
    ``[G, KV, L, D]``, one prefix per group; mask bool ``[G, L]`` marks its real slots (every query
    sees the whole prefix, which precedes all of its row's own tokens). The queries of a group are
    stacked into one ``[R*T*heads, D]`` operand per (group, KV head), so each prefix is read once per
    group, not once per row. A group with no real slot gives ``total == 0`` and ``top == _NEG``, which
    ``merge_attention`` weighs by zero.
    """
    b, t, n, d = q.shape
    g, kv = k.shape[0], k.shape[1]
    r, per_kv = b // g, n // kv
    qg = q.reshape(g, r, t, kv, per_kv, d).transpose(0, 3, 1, 2, 4, 5).reshape(g, kv, r * t * per_kv, d)
    qg, k = _dot_operands(qg, k)
    dims = (((3,), (3,)), ((0, 1), (0, 1)))  # contract head_dim; batch over (G, KV)
    scores = jax.lax.dot_general(k, qg, dims, preferred_element_type=jnp.float32)  # [G, KV, L, M]
    visible = mask[:, None, None, :]
    scores = jnp.where(visible, jnp.swapaxes(scores, 2, 3) * (1.0 / math.sqrt(d)), _NEG)  # [G, KV, M, L]
    top = jax.lax.stop_gradient(jnp.max(scores, axis=-1))
    weights = jnp.where(visible, jnp.exp(scores - top[..., None]), 0.0)
    total = jnp.sum(weights, axis=-1)
    dims = (((3,), (2,)), ((0, 1), (0, 1)))  # contract slots; batch over (G, KV)
    weights, v = _dot_operands(weights.astype(v.dtype), v)
    out = jax.lax.dot_general(weights, v, dims, preferred_element_type=jnp.float32)

    def per_row(x: jax.Array) -> jax.Array:  # [G, KV, M, ...] -> [B, T, KV, heads per KV, ...]
        x = x.reshape(g, kv, r, t, per_kv, *x.shape[3:])
        return jnp.moveaxis(x, 1, 3).reshape(b, t, kv, per_kv, *x.shape[5:])

    return per_row(out), per_row(top), per_row(total)


def merge_attention(*parts: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
    """Exact softmax attention over the union of disjoint key blocks from their partials (the
    log-sum-exp merge): each block is rescaled to the common maximum before the sums are combined.
    Returns float32 ``[B, T, KV, G, D]``."""
    top = parts[0][1]
    for _, t, _ in parts[1:]:
        top = jnp.maximum(top, t)
    out = total = 0.0
    for o, t, s in parts:
        scale = jnp.exp(t - top)
        out = out + o * scale[..., None]
        total = total + s * scale
    return out / total[..., None]


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, chunk: int) -> jax.Array:
    """Causal self-attention over a full sequence (q ``[B, T, N, D]``, k/v ``[B, KV, T, D]``), in query
    chunks of ``chunk`` rows.

    Chunk ``[s, e)`` only reads keys ``[0, e)``: the masked upper triangle is mostly never computed
    (about half the attention FLOPs at long lengths) and each chunk's scores stay cache-sized.
    ``segments`` int ``[B, S]``: 0 on padding, and a token reads only the earlier tokens of its own
    segment (a 0/1 mask is one segment per row; several make a packed row of independent sequences,
    a block-diagonal causal mask). ``chunk <= 0`` means one chunk. Long sequences use bigger chunks so
    that at most ``_MAX_CHUNKS`` are unrolled (compile time stays bounded).
    """
    t = q.shape[1]
    chunk = t if chunk <= 0 else max(chunk, -(-t // _MAX_CHUNKS))  # bound the unrolled chunk count
    outs = []
    for start in range(0, t, chunk):
        end = min(start + chunk, t)
        causal = jnp.arange(start, end)[:, None] >= jnp.arange(end)[None, :]
        keys = segments[:, None, :end]
        mask = causal[None] & (keys > 0) & (keys == segments[:, start:end, None])
        outs.append(grouped_attention(q[:, start:end], k[:, :, :end], v[:, :, :end], mask))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs):
        h, n, kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        pdt = jnp.dtype(cfg.param_dtype)
        self.q_proj = Projection((h, n, d), (n, d) if cfg.attention_bias else None, pdt, rngs)
        self.k_proj = Projection((h, kv, d), (kv, d) if cfg.attention_bias else None, pdt, rngs)
        self.v_proj = Projection((h, kv, d), (kv, d) if cfg.attention_bias else None, pdt, rngs)
        self.o_proj = Projection((n, d, h), None, pdt, rngs)
        self.cfg = cfg

    def qkv(
        self, x: jax.Array, positions: jax.Array, dropout_key: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        dt = x.dtype
        q = self.q_proj.apply(x, 1, dt, _fold(dropout_key, 0))
        k = self.k_proj.apply(x, 1, dt, _fold(dropout_key, 1))
        v = self.v_proj.apply(x, 1, dt, _fold(dropout_key, 2))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, attn: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        return self.o_proj.apply(attn, 2, attn.dtype, _fold(dropout_key, 3))


def _fold(key: jax.Array | None, i: int) -> jax.Array | None:
    """A projection's own dropout key (None: no adapter dropout, as in sampling and evaluation)."""
    return None if key is None else jax.random.fold_in(key, i)


class Projection(nnx.Module):
    """A kernel with explicit head axes, an optional bias and an optional LoRA adapter (``lora.py``).

    ``apply`` contracts the last ``n_in`` axes of ``x`` with the first ``n_in`` of the kernel as one
    plain 2-D matmul (rows = all leading dims): XLA:CPU runs that faster than the equivalent
    multi-axis einsum, whose weight gradient otherwise needs layout copies.
    """

    def __init__(self, shape, bias_shape, param_dtype, rngs: nnx.Rngs):
        self.kernel = _normal(rngs, shape, param_dtype)
        self.bias = nnx.Param(jnp.zeros(bias_shape, param_dtype)) if bias_shape is not None else None
        self.lora = nnx.data(None)

    def apply(self, x: jax.Array, n_in: int, dtype, dropout_key: jax.Array | None = None) -> jax.Array:
        kernel = self.kernel[...].astype(dtype)
        in_shape, out_shape = kernel.shape[:n_in], kernel.shape[n_in:]
        lead = x.shape[: x.ndim - n_in]
        rows = x.reshape(-1, math.prod(in_shape))
        y = rows @ kernel.reshape(math.prod(in_shape), -1)
        if self.lora is not None:
            y = y + self.lora(rows, dtype, dropout_key)
        y = y.reshape(*lead, *out_shape)
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype)
        return y


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs):
        h, i, pdt = cfg.hidden_size, cfg.intermediate_size, jnp.dtype(cfg.param_dtype)
        self.gate_proj = Projection((h, i), None, pdt, rngs)
        self.up_proj = Projection((h, i), None, pdt, rngs)
        self.down_proj = Projection((i, h), None, pdt, rngs)

    def __call__(self, x: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        dt = x.dtype
        gate = self.gate_proj.apply(x, 1, dt, _fold(dropout_key, 4))
        up = self.up_proj.apply(x, 1, dt, _fold(dropout_key, 5))
        return self.down_proj.apply(jax.nn.silu(gate) * up, 1, dt, _fold(dropout_key, 6))


class Block(nnx.Module):
    """Pre-norm decoder block: attention and SwiGLU MLP, each with a residual connection."""

    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs):
        pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, dt)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, dt)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(
        self, x: jax.Array, positions: jax.Array, key_mask: jax.Array, dropout_key: jax.Array | None = None
    ) -> jax.Array:
        q, k, v = self.attn.qkv(self.input_norm(x), positions, dropout_key)
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, KV, T, D], the cache's layout
        attn = causal_attention(q, k, v, key_mask, self.attn.cfg.attention_chunk)
        x = x + self.attn.out(attn, dropout_key)
        return x + self.mlp(self.post_attn_norm(x), dropout_key)

    def decode(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        k_cache: jax.Array,
        v_cache: jax.Array,
        write_index: jax.Array,
        layer: jax.Array | None = None,
        fresh: bool = False,
        prefix: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Like ``__call__`` but writes this step's K/V into slot ``write_index`` of the cache (an
        in-place update of only the new slots) and attends over it. The cache is this layer's
        ``[B, KV, S, D]`` arrays, or with ``layer`` the stacked ``[L, B, KV, S, D]`` ones. ``fresh``:
        the cache is empty before these tokens, so they attend among themselves only. ``prefix``: this
        layer's shared prefix (k, v ``[G, KV, L, D]``, mask ``[G, L]``) that precedes every row's own
        slots; the two attentions are merged exactly (``merge_attention``)."""
        q, k, v = self.attn.qkv(self.input_norm(x), positions)
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, KV, T, D]: only the new slots move
        zero = jnp.zeros((), jnp.int32)
        start = (zero, zero, write_index, zero)
        if layer is not None:  # stacked cache: write into (and read) this layer's slice
            start, new_k, new_v = (jnp.asarray(layer, jnp.int32), *start), k[None], v[None]
        else:
            new_k, new_v = k, v
        ck = jax.lax.dynamic_update_slice(k_cache, new_k.astype(k_cache.dtype), start)
        cv = jax.lax.dynamic_update_slice(v_cache, new_v.astype(v_cache.dtype), start)
        if fresh:
            read_k, read_v, mask = k, v, mask[:, :, : k.shape[2]]
        else:
            read_k, read_v = (ck, cv) if layer is None else (ck[layer], cv[layer])
        if prefix is None:
            attn = grouped_attention(q, read_k.astype(q.dtype), read_v.astype(q.dtype), mask)
        else:
            pk, pv, pmask = prefix
            own = attention_partials(q, read_k.astype(q.dtype), read_v.astype(q.dtype), mask)
            shared = prefix_attention_partials(q, pk.astype(q.dtype), pv.astype(q.dtype), pmask)
            attn = merge_attention(shared, own).astype(q.dtype).reshape(q.shape)
        x = x + self.attn.out(attn)
        return x + self.mlp(self.post_attn_norm(x)), ck, cv


def _stack_blocks(cfg: Qwen2Config, rngs: nnx.Rngs) -> Block:
    """One Block whose params carry a leading layer dimension (for ``lax.scan``)."""
    graphdef = None
    states = []
    for _ in range(cfg.num_hidden_layers):
        graphdef, state = nnx.split(Block(cfg, rngs=rngs))
        states.append(state)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    return nnx.merge(graphdef, stacked)


@functools.cache
def _plain_block_graphdef(cfg: Qwen2Config) -> nnx.GraphDef:
    """The graph of a block without adapters (a stacked block has the same graph as one layer's)."""
    return nnx.graphdef(nnx.eval_shape(lambda: Block(cfg, rngs=nnx.Rngs(0))))


class Qwen2ForCausalLM(nnx.Module):
    """Qwen2 causal LM. Call it for training logits; use ``decode`` with a KVCache for sampling."""

    def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs):
        cfg = config
        pdt, dt = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        self.config = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size, pdt, rngs)
        if cfg.scan_layers:
            self.layers = _stack_blocks(cfg, rngs)
        else:
            self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pdt, dt)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Projection((cfg.hidden_size, cfg.vocab_size), None, pdt, rngs)
        )

    # -- helpers -------------------------------------------------------------------------------------
    def _embed(self, input_ids: jax.Array) -> jax.Array:
        table = self.embed.embedding[...]
        return jnp.take(table, input_ids, axis=0).astype(self.config.dtype)

    def _logits(self, h: jax.Array) -> jax.Array:
        dt = jnp.dtype(self.config.dtype)
        if self.lm_head is None:
            w = self.embed.embedding[...].astype(dt).T
        else:
            w = self.lm_head.kernel[...].astype(dt)
        rows, w = _dot_operands(h.reshape(-1, h.shape[-1]), w)
        logits = jnp.matmul(rows, w, preferred_element_type=jnp.float32)
        return logits.reshape(*h.shape[:-1], w.shape[-1])

    def _run_layers(
        self, x: jax.Array, positions: jax.Array, key_mask: jax.Array, dropout_key: jax.Array | None
    ) -> jax.Array:
        def body(graphdef, states, h, key):
            return nnx.merge(graphdef, *states)(h, positions, key_mask, key)

        if self.config.remat:
            body = jax.checkpoint(body, static_argnums=(0,))
        n = self.config.num_hidden_layers
        keys = None if dropout_key is None else jax.random.split(dropout_key, n)
        if self.config.scan_layers:
            return self._scan_layers(body, x, keys)
        for i, layer in enumerate(self.layers):
            graphdef, state = nnx.split(layer)
            x = body(graphdef, (state,), x, None if keys is None else keys[i])
        return x

    def _scan_layers(self, body, x: jax.Array, keys: jax.Array | None) -> jax.Array:
        """The stacked blocks as one ``lax.scan``; with adapters on the top layers only, as two: the
        bottom blocks run without adapters (they hold no trained parameter, so autodiff gives them no
        backward pass), then the adapted top blocks."""

        def scan(graphdef, states, h, layer_keys):
            step = lambda h, xs: (body(graphdef, xs[0], h, xs[1]), None)  # noqa: E731
            return jax.lax.scan(step, h, (states, layer_keys))[0]

        graphdef, adapters, rest = nnx.split(self.layers, LoRAParam, ...)
        first = self.config.num_hidden_layers - stacked_adapter_layers(
            adapters, self.config.num_hidden_layers
        )
        if first == 0:
            return scan(graphdef, (adapters, rest), x, keys)
        below = jax.tree.map(lambda a: a[:first], rest)
        above = jax.tree.map(lambda a: a[first:], rest)
        x = scan(_plain_block_graphdef(self.config), (below,), x, None if keys is None else keys[:first])
        return scan(graphdef, (adapters, above), x, None if keys is None else keys[first:])

    # -- public --------------------------------------------------------------------------------------
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        return_hidden: bool = False,
        dropout_key: jax.Array | None = None,
    ):
        """Full-sequence forward. Returns float32 logits ``[B, T, V]`` (and final hidden if asked).

        ``attention_mask`` marks real tokens (left or right padding); ``positions`` default to
        ``cumsum(mask) - 1`` so left-padded rows start at position 0. ``dropout_key`` turns on the
        LoRA adapters' dropout (training only); without it the forward is deterministic.
        """
        hidden = self.hidden(input_ids, attention_mask, positions, dropout_key=dropout_key)
        logits = self._logits(hidden)
        return (logits, hidden) if return_hidden else logits

    def hidden(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        dropout_key: jax.Array | None = None,
    ) -> jax.Array:
        """The final (normed) hidden states ``[B, T, hidden]`` without the LM head: a caller that needs
        logits at a few positions only gathers them first and calls ``head`` on those. An integer
        ``attention_mask`` > 1 packs several sequences in a row: segment ids, each with its own
        ``positions`` from 0 (``ppo.pack_segments``)."""
        input_ids = jnp.asarray(input_ids, jnp.int32)
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), jnp.bool_)
        attention_mask = jnp.asarray(attention_mask).astype(jnp.int32)  # segment ids (see causal_attention)
        if positions is None:
            positions = jnp.maximum(jnp.cumsum(attention_mask > 0, axis=-1, dtype=jnp.int32) - 1, 0)
        x = self._run_layers(self._embed(input_ids), positions, attention_mask, dropout_key)
        return self.final_norm(x)

    def head(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits ``[..., V]`` of final hidden states ``[..., hidden]``."""
        return self._logits(hidden)

    def decode(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        cache: KVCache,
        write_index: jax.Array,
        kv_mask: jax.Array,
        *,
        fresh: bool = False,
        prefix: SharedPrefix | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Process ``T >= 1`` new tokens per row against the cache.

        The new tokens go to slots ``[write_index, write_index + T)`` of every row; ``kv_mask``
        ``[B, S]`` already marks those slots. A query at slot ``write_index + t`` attends to slots
        ``s <= write_index + t`` with ``kv_mask``. Returns float32 logits ``[B, T, V]`` and the cache.
        ``fresh`` says the cache holds nothing yet (``write_index`` is 0): the tokens then attend over
        their own ``T`` slots instead of all ``S``, which saves a prompt's prefill the empty tail.
        ``prefix``: prompt heads that groups of rows share, stored once per group (``SharedPrefix``);
        every row also attends over its group's prefix, which comes before all of its own slots.
        """
        input_ids = jnp.asarray(input_ids, jnp.int32)
        t = input_ids.shape[1]
        slots = cache.slots
        write_index = jnp.asarray(write_index, jnp.int32)
        query_slot = write_index + jnp.arange(t, dtype=jnp.int32)
        causal = jnp.arange(slots, dtype=jnp.int32)[None, :] <= query_slot[:, None]
        mask = causal[None] & jnp.asarray(kv_mask).astype(jnp.bool_)[:, None, :]
        x = self._embed(input_ids)

        def body(graphdef, state, h, k_cache, v_cache, layer=None, shared=None):
            block = nnx.merge(graphdef, state)
            own = None if shared is None else (*shared, prefix.mask)
            return block.decode(h, positions, mask, k_cache, v_cache, write_index, layer, fresh, own)

        if self.config.scan_layers:
            graphdef, state = nnx.split(self.layers)
            n = self.config.num_hidden_layers
            if stacked_adapter_layers(nnx.state(self.layers, LoRAParam), n) != n:
                raise ValueError(
                    "decode with adapters on some stacked layers: merge them first (lora.merged)"
                )

            def step(carry, inputs):
                layer_state, layer, shared = inputs
                return body(graphdef, layer_state, *carry, layer, shared), None

            layer_ids = jnp.arange(self.config.num_hidden_layers, dtype=jnp.int32)
            shared = None if prefix is None else (prefix.cache.k, prefix.cache.v)
            (x, ck, cv), _ = jax.lax.scan(step, (x, cache.k, cache.v), (state, layer_ids, shared))
            cache = KVCache(ck, cv)
        else:
            ks, vs = [], []
            shared = [None] * len(cache.k) if prefix is None else zip(prefix.cache.k, prefix.cache.v)
            for layer, k_cache, v_cache, own in zip(self.layers, cache.k, cache.v, shared, strict=True):
                graphdef, state = nnx.split(layer)
                x, k_cache, v_cache = body(graphdef, state, x, k_cache, v_cache, shared=own)
                ks.append(k_cache)
                vs.append(v_cache)
            cache = KVCache(tuple(ks), tuple(vs))
        logits = self._logits(self.final_norm(x))
        return logits, cache
