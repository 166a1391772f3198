"""LoRA adapters inside the model's projections: ``y = x W + scale * dropout(x) A B``.

Adapters are ``LoRAParam`` variables, a kind of their own (not ``nnx.Param``), so
``nnx.split(model, LoRAParam, ...)`` separates what is trained from the frozen base, and the base's
Hugging Face I/O never sees them. ``B`` starts at zero, so a fresh adapter changes no logit. Adapters
are float32 whatever the base's storage dtype: they are the master weights the optimizer moves.
With scanned layers the adapters carry the same leading ``[layers]`` dimension as the kernels.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

# Short target name -> (sub-module of a Block, projection, input axes of its kernel).
TARGETS = {
    "q": ("attn", "q_proj", 1),
    "k": ("attn", "k_proj", 1),
    "v": ("attn", "v_proj", 1),
    "o": ("attn", "o_proj", 2),
    "gate": ("mlp", "gate_proj", 1),
    "up": ("mlp", "up_proj", 1),
    "down": ("mlp", "down_proj", 1),
}


class LoRAParam(nnx.Variable):
    """A trainable adapter weight (``A`` or ``B``); the base's ``nnx.Param`` stay frozen beside it."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """``rank`` 0 means no adapters (full fine-tuning); ``scale = alpha / rank`` as in ``peft``."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = tuple(TARGETS)
    layers: int = 0  # adapters on the top ``layers`` blocks only (0: every block)

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"lora.rank={self.rank!r}: must be an integer >= 0")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or self.alpha <= 0:
            raise ValueError(f"lora.alpha={self.alpha!r}: must be a number > 0")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float):
            raise ValueError(f"lora.dropout={self.dropout!r}: must be a number in [0, 1)")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout={self.dropout!r}: must be a number in [0, 1)")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise ValueError(f"lora.layers={self.layers!r}: must be an integer >= 0 (0: every layer)")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(
                f"lora.targets={self.targets!r}: must be distinct names among {', '.join(TARGETS)}"
            )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def first_layer(self, num_layers: int) -> int:
        """The lowest block that carries adapters; the blocks below it get no backward pass."""
        if self.layers > num_layers:
            raise ValueError(f"lora.layers={self.layers}: the model has only {num_layers} layers")
        return num_layers - self.layers if self.layers else 0


class LoRA(nnx.Module):
    """The low-rank update of one projection: ``a`` ``[*in_axes, rank]``, ``b`` ``[rank, *out_axes]``,
    each behind a leading ``[layers]`` axis when ``stacked``."""

    def __init__(self, a: jax.Array, b: jax.Array, scale: float, dropout: float, stacked: bool):
        self.a = LoRAParam(a)
        self.b = LoRAParam(b)
        self.scale = scale
        self.dropout = dropout
        self.stacked = stacked

    def __call__(self, rows: jax.Array, dtype, dropout_key: jax.Array | None) -> jax.Array:
        """The update for ``rows`` ``[n, in]`` (the projection's flattened input): ``[n, out]``."""
        a = self.a[...].astype(dtype)
        b = self.b[...].astype(dtype)
        rank = a.shape[-1]
        if dropout_key is not None and self.dropout > 0:
            keep = jax.random.bernoulli(dropout_key, 1.0 - self.dropout, rows.shape)
            rows = jnp.where(keep, rows / (1.0 - self.dropout), 0.0).astype(rows.dtype)
        low = rows @ a.reshape(-1, rank)
        return (low @ b.reshape(rank, -1)) * jnp.asarray(self.scale, dtype)

    def delta(self) -> jax.Array:
        """``scale * A B`` in the kernel's layout (with a leading layer axis when stacked), float32."""
        a, b = self.a[...], self.b[...]
        lead = a.shape[: int(self.stacked)]
        rank = a.shape[-1]
        flat = jnp.matmul(a.reshape(*lead, -1, rank), b.reshape(*lead, rank, -1))
        return (self.scale * flat).reshape(*a.shape[:-1], *b.shape[len(lead) + 1 :])


def projections(model: nnx.Module, targets: Sequence[str]) -> Iterator[tuple[int | None, str, nnx.Module]]:
    """``(layer or None when stacked, target, projection)`` for every targeted projection."""
    blocks = [(None, model.layers)] if model.config.scan_layers else list(enumerate(model.layers))
    for layer, block in blocks:
        for target in targets:
            group, name, _ = TARGETS[target]
            yield layer, target, getattr(getattr(block, group), name)


def stacked_adapter_layers(adapters: nnx.State, num_layers: int) -> int:
    """How many of the top stacked blocks carry adapters (the adapters' leading axis; every block when
    there are none, so that the layer scan stays one)."""
    leaves = jax.tree.leaves(adapters)
    return leaves[0].shape[0] if leaves else num_layers


def adapted_layers(model: nnx.Module) -> list[int]:
    """The indices of the blocks that carry adapters, lowest first."""
    n = model.config.num_hidden_layers
    if model.config.scan_layers:
        return list(range(n - stacked_adapter_layers(nnx.state(model.layers, LoRAParam), n), n))
    return sorted({layer for layer, _, proj in projections(model, tuple(TARGETS)) if proj.lora is not None})


def add_lora(model: nnx.Module, cfg: LoRAConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Attach fresh adapters to ``cfg.targets`` of the top ``cfg.layers`` blocks (every block when 0), in
    place; returns the model. With scanned layers they are stacked over the adapted blocks only.

    ``A`` is drawn like ``peft``'s default (Kaiming-uniform, bound ``1/sqrt(fan_in)``), ``B`` is zero.
    """
    if cfg.rank == 0:
        return model
    stacked = model.config.scan_layers
    first = cfg.first_layer(model.config.num_hidden_layers)
    for layer, target, proj in projections(model, cfg.targets):
        if layer is not None and layer < first:
            continue
        n_in = TARGETS[target][2]
        shape = proj.kernel[...].shape
        lead, kernel = shape[: int(stacked)], shape[int(stacked) :]
        lead = (lead[0] - first,) if stacked else lead
        in_shape, out_shape = kernel[:n_in], kernel[n_in:]
        bound = 1.0 / math.sqrt(math.prod(in_shape))
        a = jax.random.uniform(rngs.params(), (*lead, *in_shape, cfg.rank), jnp.float32, -bound, bound)
        b = jnp.zeros((*lead, cfg.rank, *out_shape), jnp.float32)
        proj.lora = LoRA(a, b, cfg.scale, cfg.dropout, stacked)
    return model


def has_lora(model: nnx.Module) -> bool:
    """Whether ``model`` carries adapters (an export must merge them: the base alone is not the policy)."""
    return bool(jax.tree.leaves(nnx.state(model, LoRAParam)))


def merged(model: nnx.Module) -> nnx.Module:
    """A model without adapters whose kernels are ``W + scale * A B`` (in the base's storage dtype).

    The input model is left as it is; only the targeted kernels are new arrays, the rest is shared.
    """
    cfg = model.config
    base_def = nnx.graphdef(nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0))))
    base = nnx.state(model, nnx.Param)
    out = nnx.merge(base_def, base)
    for (_, _, proj), (_, _, target) in zip(_adapted(model), _adapted_like(out, model), strict=True):
        kernel = proj.kernel[...]
        delta = proj.lora.delta()
        if delta.shape != kernel.shape:  # stacked adapters on the top blocks only
            delta = jnp.zeros(kernel.shape, jnp.float32).at[kernel.shape[0] - delta.shape[0] :].set(delta)
        target.kernel = nnx.Param((kernel.astype(jnp.float32) + delta).astype(kernel.dtype))
    return out


def _adapted(model: nnx.Module) -> list[tuple[int | None, str, nnx.Module]]:
    return [p for p in projections(model, tuple(TARGETS)) if p[2].lora is not None]


def _adapted_like(other: nnx.Module, model: nnx.Module) -> list[tuple[int | None, str, nnx.Module]]:
    """The projections of ``other`` at the places where ``model`` has adapters."""
    wanted = {(layer, target) for layer, target, _ in _adapted(model)}
    return [p for p in projections(other, tuple(TARGETS)) if (p[0], p[1]) in wanted]


def merge_fn(graphdef: nnx.GraphDef) -> Callable[[nnx.State, nnx.State], nnx.State]:
    """Jitted ``(adapters, base) -> params`` of the merged model (``merged``), laid out like the base:
    the sampler's copy of the policy, made once per iteration."""
    return jax.jit(lambda adapters, base: nnx.state(merged(nnx.merge(graphdef, adapters, base)), nnx.Param))
