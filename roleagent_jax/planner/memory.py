"""How many bytes each part of a run holds per device, from abstract shapes (nothing is allocated).

Parameters and optimizer state are exact: the model and ``optimizer.init`` are traced with
``nnx.eval_shape`` / ``jax.eval_shape`` and every leaf is divided by the mesh axes its partition rule
(``sharding.PARTITION_RULES``) puts on it. The KV cache is ``init_cache``'s abstract shape for one
sampler call, in the sampler's own shared-prefix layout when rows share prompt heads. Activations,
the log-prob pass and the prefill are estimates (formulas in their functions and docs/scaling.md).
``make_plan`` adds them up per phase; ``roleagent_jax.plan`` is the command line around it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM, init_cache
from roleagent_jax.models.lora import TARGETS as LORA_TARGETS
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora
from roleagent_jax.parallel.sharding import spec_for
from roleagent_jax.planner.workload import Workload, abstract_mesh
from roleagent_jax.rl.optimizer import make_optimizer
from roleagent_jax.sampling.plan import PROMPT_BUCKETS, capped_batch_buckets
from roleagent_jax.sampling.prefix import PrefixLayout, chunk_by_group, plan_layout

GIB = 1024**3
# Share of HBM a plan may use: the runtime, XLA's scratch space and fragmentation take the rest.
USABLE_FRACTION = 0.9


# ---------------------------------------------------------------------------------------------- shapes


def abstract_params(cfg: Qwen2Config) -> nnx.State:
    """The model's parameter state as ShapeDtypeStructs (nothing allocated)."""
    model = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    return nnx.state(model)


def abstract_lora(cfg: Qwen2Config, work: Workload) -> tuple[Any, nnx.State, nnx.State]:
    """(graphdef, adapters, base) of the model with ``work``'s adapters, as ShapeDtypeStructs."""
    lora = LoRAConfig(
        rank=work.lora_rank, targets=work.lora_targets or LoRAConfig().targets, layers=work.lora_layers
    )
    model = nnx.eval_shape(lambda: add_lora(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), lora, nnx.Rngs(1)))
    return nnx.split(model, LoRAParam, ...)


def abstract_opt_state(params: Any, settings: dict) -> Any:
    """The trainer's optimizer state for ``params`` (``optimizer.make_optimizer(**settings)``), abstract."""
    return jax.eval_shape(make_optimizer(**settings).init, params)


def tree_bytes(tree: Any) -> int:
    """Total bytes of every array leaf (global, unsharded)."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _path_str(path: tuple) -> str:
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return "/".join(p for p in parts if p not in ("value", "raw_value"))


def _shard_factor(spec: P, sizes: dict[str, int]) -> int:
    factor = 1
    for entry in spec:
        for name in entry if isinstance(entry, tuple) else (entry,):
            if name is not None:
                factor *= sizes[name]
    return factor


def device_bytes(tree: Any, mesh: jax.sharding.AbstractMesh, params: Any | None = None) -> int:
    """Bytes one device holds of ``tree`` under the partition rules.

    ``params`` given (optimizer state): a leaf whose path ends with a parameter's path and has its shape
    (Adam moments) is sharded like that parameter, anything else (step counts, hyper-parameters) is
    replicated, as the train step places them. Without ``params`` every leaf is a parameter.
    """
    sizes = dict(mesh.shape)
    known: dict[str, tuple[tuple[int, ...], P]] = {}
    if params is not None:
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            name = _path_str(path)
            known[name] = (tuple(leaf.shape), spec_for(name, tuple(leaf.shape), mesh=mesh))
    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        name, shape = _path_str(path), tuple(leaf.shape)
        if params is None:
            spec = spec_for(name, shape, mesh=mesh)
        else:
            parts = name.split("/")
            hits = (known.get("/".join(parts[i:])) for i in range(len(parts)))
            spec = next((s for hit in hits if hit is not None and hit[0] == shape for s in [hit[1]]), P())
        nbytes = int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
        total += nbytes // _shard_factor(spec, sizes)
    return total


def rollout_layout(work: Workload, sizes: dict[str, int]) -> PrefixLayout | None:
    """The sampler's shared-prefix layout of the rollout's largest call, or None for the plain layout.

    The requests are the rollout's: each task group's agent rows and its predictor rows (their own
    sharing group), split into calls of at most the call's row count as the sampler splits them
    (whole groups, ``prefix.chunk_by_group``); every prompt is ``max_prompt_tokens`` long (the worst
    case) and the rows of a group share their first ``shared_prefix`` tokens. The sampler's planner
    then lays out the largest call as it would at run time.
    """
    if not work.shared_prefix:
        return None
    every: list[tuple[str, int]] = []
    for g in range(work.task_groups):
        every += [("agent", g)] * work.group_size + [("predictor", g)] * work.predictor_rows
    keys = [every[i] for i in max(chunk_by_group(every, work.rollout_rows), key=len)]
    rest = work.prompt_tokens - work.shared_prefix
    prompts = []
    for b, (role, g) in enumerate(keys):  # a group's head (negative ids), then ids no other row has
        head = [-1 - 2 * g - (role == "predictor")] * work.shared_prefix
        prompts.append(head + list(range(b * rest, (b + 1) * rest)))
    return plan_layout(
        prompts,
        keys,
        new_tokens=work.cache_len - work.prompt_len,
        prompt_buckets=PROMPT_BUCKETS,
        batch_buckets=capped_batch_buckets(work.rollout_rows),
        row_multiple=sizes["data"] * sizes["fsdp"],
    )


def kv_cache_bytes(cfg: Qwen2Config, rows: int, length: int, sizes: dict[str, int]) -> tuple[int, int]:
    """(global, per-device) bytes of one sampler call's KV cache: rows over data x fsdp, KV heads over
    tensor when they divide (``qwen2.cache_sharding``)."""
    cache = jax.eval_shape(lambda: init_cache(cfg, rows, length))
    total = tree_bytes(cache)
    heads = sizes["tensor"] if cfg.num_key_value_heads % sizes["tensor"] == 0 else 1
    return total, total // (sizes["data"] * sizes["fsdp"] * heads)


def _per_device_rows(rows: int, sizes: dict[str, int]) -> int:
    return math.ceil(rows / (sizes["data"] * sizes["fsdp"]))


def activation_bytes(
    cfg: Qwen2Config,
    rows: int,
    seq: int,
    sizes: dict[str, int],
    remat: bool,
    targets: int = 0,
    backward_layers: int = 0,
) -> dict[str, int]:
    """Estimated per-device activation memory of one training micro-batch (forward kept for backward).

    Per layer and token (compute itemsize ``b``; heads, intermediate and vocab split over ``tensor``):
    block input, two norm outputs and the attention residual ``4h·b``; q/k/v before and after RoPE
    ``2(n+2kv)d·b``; attention output ``nd·b``; MLP gate, up, silu(gate), product ``4i·b``; attention
    scores, float32 probabilities and probabilities in ``b`` ``n·T·(8+b)``. Without remat every layer keeps all of that;
    with per-layer remat only each block's input (``h·b`` per token) is kept, plus one layer's worth
    being recomputed. Logits, their float32 softmax and its gradient add ``3·V·4`` per token the head
    runs at (``targets`` per row, the response; 0: every token). With adapters on the top
    ``backward_layers`` only (0: all), only those keep activations for the backward pass: the frozen
    layers below run forward one at a time.
    """
    b = np.dtype(cfg.dtype).itemsize
    t = sizes["tensor"]
    r = _per_device_rows(rows, sizes)
    h, i, n, kv, d = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    )
    split = (2 * (n + 2 * kv) * d + n * d + 4 * i) * b + n * seq * (8 + b)
    per_token_layer = 4 * h * b + split / t
    layer = r * seq * per_token_layer
    logits = r * (targets or seq) * 3 * 4 * math.ceil(cfg.vocab_size / t)
    embed = r * seq * h * b
    kept = backward_layers or cfg.num_hidden_layers
    if remat:
        layers = kept * r * seq * h * b + layer
    else:
        layers = kept * layer
    return {"layers": int(layers), "logits": int(logits), "embed": int(embed), "one_layer": int(layer)}


def logprob_bytes(cfg: Qwen2Config, rows: int, seq: int, sizes: dict[str, int], targets: int = 0) -> int:
    """Per-device peak of the forward-only log-prob pass (old and reference log-probs): one layer's
    activations at a time plus float32 logits and their exponentials ``2·V·4`` per token the head runs
    at (``targets`` per row; 0: every token)."""
    act = activation_bytes(cfg, rows, seq, sizes, remat=True)
    r = _per_device_rows(rows, sizes)
    head = r * (targets or seq) * 2 * 4 * math.ceil(cfg.vocab_size / sizes["tensor"])
    return int(act["one_layer"] + head)


def prefill_bytes(
    cfg: Qwen2Config, work: Workload, sizes: dict[str, int], layout: PrefixLayout | None = None
) -> int:
    """Per-device transient of the sampler's prefill (one layer at a time, no backward): attention
    scores, masked scores and probabilities ``n·P·S·(4+4+b)`` per row, plus the MLP's ``3·P·i·b``.
    With a shared-prefix layout the larger of its two stages: each group's prefix over itself, then
    each row's suffix over its group's prefix and its own slots."""
    b = np.dtype(cfg.dtype).itemsize
    n, i = cfg.num_attention_heads, cfg.intermediate_size

    def stage(rows: int, p: int, s: int) -> int:
        return int(_per_device_rows(rows, sizes) * (n * p * s * (8 + b) + 3 * p * i * b) / sizes["tensor"])

    if layout is None:
        return stage(work.rollout_rows, work.prompt_len, work.cache_len)
    new = work.cache_len - work.prompt_len
    own = layout.suffix_bucket
    return max(
        stage(layout.groups, layout.prefix_bucket, layout.prefix_bucket),
        stage(layout.rows, own, layout.prefix_bucket + own + new),
    )


# ---------------------------------------------------------------------------------------------- plan


@dataclasses.dataclass
class Plan:
    model: str
    mesh: dict[str, int]
    hbm_gb: float
    work: Workload
    params_total: int
    rows: list[tuple[str, int, int, str]]  # (component, global bytes, per-device bytes, note)
    phases: dict[str, int]  # per-device bytes at the peak of each phase
    peak: int
    fits: bool
    advice: list[str] = dataclasses.field(default_factory=list)
    xla_train: dict[str, int] | None = None  # compiled train step, per device (with --xla)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "mesh": self.mesh,
            "hbm_gb": self.hbm_gb,
            "params": self.params_total,
            "workload": dataclasses.asdict(self.work),
            "components": {name: {"global_bytes": g, "device_bytes": dev} for name, g, dev, _ in self.rows},
            "phases_device_bytes": self.phases,
            "peak_device_bytes": self.peak,
            "peak_device_gib": round(self.peak / GIB, 3),
            "usable_gib": round(self.hbm_gb * USABLE_FRACTION, 3),
            "fits": self.fits,
            "advice": self.advice,
        }


def _as_f32(x: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, np.float32)


def make_plan(cfg: Qwen2Config, label: str, sizes: dict[str, int], work: Workload, hbm_gb: float) -> Plan:
    """Every component's global and per-device bytes, the per-phase peaks and whether it fits."""
    mesh = abstract_mesh(sizes)
    micro = max(1, work.mini_batch_rows // work.micro_batch_rows)
    copy = (0, 0)  # LoRA: the sampler's copy of the adapted kernels, merged once per iteration
    if work.lora_rank:
        _, params, base = abstract_lora(cfg, work)  # the trained params are the adapters
        b_glob, b_dev = tree_bytes(base), device_bytes(base, mesh)
        kernels = tuple(f"{LORA_TARGETS[t][1]}/kernel" for t in work.lora_targets or LORA_TARGETS)
        flat = {"/".join(map(str, k)): v for k, v in nnx.to_flat_state(base)}
        merged = {k: v for k, v in flat.items() if k.endswith(kernels)}
        copy = (tree_bytes(merged), device_bytes(merged, mesh))
        if work.lora_layers and not cfg.scan_layers:  # only the adapted layers' kernels are copied
            copy = tuple(n * work.lora_layers // cfg.num_hidden_layers for n in copy)
    else:
        params = abstract_params(cfg)
        b_glob = b_dev = 0
    opt = abstract_opt_state(params, work.optimizer)
    t_glob, t_dev = tree_bytes(params), device_bytes(params, mesh)
    p_glob, p_dev = b_glob + t_glob, b_dev + t_dev
    o_glob, o_dev = tree_bytes(opt), device_bytes(opt, mesh, params=params)
    n_trained = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    # The model's size: with LoRA the base's (its adapters are named beside it).
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(base)) if work.lora_rank else n_trained
    # Gradients in the trained params' dtype, plus a float32 accumulator across micro-batches.
    g_glob = t_glob + (4 * n_trained if micro > 1 else 0)
    g_dev = t_dev + (device_bytes(jax.tree.map(_as_f32, params), mesh) if micro > 1 else 0)
    ref = (p_glob, p_dev) if work.kl and not work.lora_rank else (0, 0)
    layout = rollout_layout(work, sizes)
    if layout is None:
        kv_glob, kv_dev = kv_cache_bytes(cfg, work.rollout_rows, work.cache_len, sizes)
        kv_note = f"{work.rollout_rows} rows x {work.cache_len} slots, {np.dtype(cfg.dtype).name}"
        pre_note = f"attention over a {work.prompt_len}-token prompt, one layer"
    else:
        new = work.cache_len - work.prompt_len
        shared = kv_cache_bytes(cfg, layout.groups, layout.prefix_bucket, sizes)
        own = kv_cache_bytes(cfg, layout.rows, layout.suffix_bucket + new, sizes)
        kv_glob, kv_dev = shared[0] + own[0], shared[1] + own[1]
        kv_note = (
            f"{layout.groups} groups x {layout.prefix_bucket} shared slots + {layout.rows} rows x "
            f"{layout.suffix_bucket + new}, {np.dtype(cfg.dtype).name}"
        )
        pre_note = f"{layout.prefix_bucket}-token prefix per group, {layout.suffix_bucket} per row"
    pre = prefill_bytes(cfg, work, sizes, layout)
    kept = work.lora_layers if work.lora_rank else 0  # layers that run a backward pass (0: all)
    shape = (cfg, work.micro_batch_rows, work.seq_len, sizes)
    act = activation_bytes(*shape, work.remat, work.target_len, kept)
    act_other = activation_bytes(*shape, not work.remat, work.target_len, kept)
    act_dev = act["layers"] + act["logits"] + act["embed"]
    other_dev = act_other["layers"] + act_other["logits"] + act_other["embed"]
    nd = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
    lp = logprob_bytes(cfg, work.micro_batch_rows, work.seq_len, sizes, work.target_len)
    lp_whole = logprob_bytes(cfg, work.mini_batch_rows, work.seq_len, sizes, work.target_len)
    remat_note = "remat on" if work.remat else "remat off"
    act_note = f", head at {work.target_len}" if work.target_len else ""
    act_note += f", backward in the top {kept} layers" if kept else ""
    p_note = f"{n_params / 1e9:.3f}B x {np.dtype(cfg.param_dtype).name}"
    if work.lora_rank:
        p_note += f" + rank-{work.lora_rank} adapters ({n_trained / 1e6:.2f}M x float32)"
        p_note += f" on the top {work.lora_layers} layers" if work.lora_layers else ""
    ref_note = "KL on: frozen copy" if work.kl else "KL off"
    if work.lora_rank and work.kl:
        ref_note = "KL on: the base with adapters off (no copy)"
    rows = [
        ("parameters", p_glob, p_dev, p_note),
        (
            "optimizer state",
            o_glob,
            o_dev,
            "AdamW moments (dtypes as optax makes them), sharded like the "
            + ("adapters" if work.lora_rank else "params"),
        ),
        (
            "gradients",
            g_glob,
            g_dev,
            ("adapters only, " if work.lora_rank else "")
            + "param dtype"
            + (" + float32 accumulator" if micro > 1 else ""),
        ),
        ("reference model", ref[0], ref[1], ref_note),
        *(
            [("sampling copy (LoRA)", *copy, "adapted kernels merged, during rollouts only")]
            if work.lora_rank
            else []
        ),
        ("KV cache (rollout)", kv_glob, kv_dev, kv_note),
        ("prefill transient", pre * nd, pre, pre_note),
        (
            f"activations ({remat_note})",
            act_dev * nd,
            act_dev,
            f"{work.micro_batch_rows} rows x {work.seq_len} tokens per micro-batch{act_note}",
        ),
        (
            f"activations ({'remat off' if work.remat else 'remat on'})",
            other_dev * nd,
            other_dev,
            "for comparison",
        ),
        (
            "log-prob pass",
            lp * nd,
            lp,
            f"forward only, per micro-batch ({work.mini_batch_rows} rows at once: {lp_whole / GIB:.1f} GiB/device)",
        ),
    ]
    persistent = p_dev + o_dev + ref[1]
    phases = {
        "persistent": persistent,
        "rollout": persistent + copy[1] + kv_dev + pre,
        "logprob": persistent + lp,
        "train": persistent + g_dev + act_dev,
    }
    peak = max(phases.values())
    fits = peak <= hbm_gb * GIB * USABLE_FRACTION
    return Plan(label, dict(sizes), hbm_gb, work, n_params, rows, phases, peak, fits)
