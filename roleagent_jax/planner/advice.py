"""The planner's answers: the model to plan (a built-in, a checkpoint's config.json or the run's own), the
advice when a plan does not fit (smaller micro-batches, remat, a bigger mesh), XLA's own numbers for the
compiled train step, and `plan_from_config`, the whole planner as a function."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from roleagent_jax.models import BUILTIN_MODELS, MODEL_NAMES, Qwen2Config, Qwen2ForCausalLM, init_config
from roleagent_jax.planner.memory import (
    GIB,
    USABLE_FRACTION,
    Plan,
    abstract_lora,
    abstract_opt_state,
    abstract_params,
    make_plan,
)
from roleagent_jax.planner.workload import Workload, parse_mesh
from roleagent_jax.rl.optimizer import make_optimizer
from roleagent_jax.sampling.plan import BATCH_BUCKETS

# HBM per chip (GiB) of the accelerators users run on; --hbm-gb overrides.
CHIP_HBM_GB: dict[str, float] = {
    "v4": 32,
    "v5e": 16,
    "v5p": 95,
    "v6e": 32,
    "v3": 16,
    "a100-40": 40,
    "a100-80": 80,
    "h100": 80,
    "h200": 141,
}


def model_config(model: str, config: Any, param_dtype: str | None = None) -> tuple[Qwen2Config, str]:
    """The Qwen2Config to plan and a label for it, with the dtypes the trainer would use.

    ``model``: a built-in name (135m, 0.5b, 1.5b, 7b), a config.json file or a checkpoint directory, or ""
    for the run's own model (``config.model.path``, else the random-init ``config.model.init``).
    Pretrained weights are loaded in ``config.model.dtype`` (as the trainer does); a random init stores
    ``config.model.param_dtype``.
    """
    m = config.model
    settings = dict(dtype=m.dtype, remat=m.remat, scan_layers=m.scan_layers)
    key = model.lower()
    if key in BUILTIN_MODELS:
        fields, label = BUILTIN_MODELS[key], MODEL_NAMES[key]
    elif model or m.path:
        path = Path(model or m.path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(
                f"no config.json at {file}: pass --model=135m|0.5b|1.5b|7b, a config.json or a checkpoint directory"
            )
        fields, label = json.loads(file.read_text()), str(path)
    else:
        vocab = int(config.tokenizer.train_vocab_size)
        cfg = init_config(m.init.to_dict(), vocab, param_dtype=param_dtype or m.param_dtype, **settings)
        return cfg, f"random init (config.model.init, vocab {vocab})"
    return Qwen2Config.from_hf(fields, param_dtype=param_dtype or m.dtype, **settings), label


# ---------------------------------------------------------------------------------------------- advice


def advise(
    cfg: Qwen2Config, label: str, sizes: dict[str, int], work: Workload, hbm_gb: float, plan: Plan
) -> list[str]:
    """Concrete changes that make the plan fit, each checked by re-planning with the change applied."""
    usable = hbm_gb * GIB * USABLE_FRACTION
    out: list[str] = []
    shards = sizes["data"] * sizes["fsdp"]

    def fits(c=cfg, s=sizes, w=work) -> Plan:
        return make_plan(c, label, s, w, hbm_gb)

    if plan.phases["persistent"] > usable:
        wider = ((f, fits(s=dict(sizes, fsdp=f))) for f in (sizes["fsdp"] * k for k in (2, 4, 8, 16, 32)))
        hit = _first_fit(wider, "persistent", usable)
        if hit:
            fsdp, trial = hit
            out.append(
                f"parameters + optimizer state need a larger slice: fsdp={fsdp} "
                f"({fsdp * sizes['data'] * sizes['tensor']} chips) holds them in "
                f"{trial.phases['persistent'] / GIB:.1f} GiB per device"
            )
        if np.dtype(cfg.param_dtype).itemsize > 2:
            trial = fits(c=cfg.replace(param_dtype="bfloat16"))
            out.append(
                f"bfloat16 weights (--config.model.param_dtype=bfloat16 or a bf16 checkpoint) cut the "
                f"persistent state to {trial.phases['persistent'] / GIB:.1f} GiB per device"
            )
        if not work.lora_rank:
            trial = fits(w=dataclasses.replace(work, lora_rank=16))
            out.append(
                f"LoRA (--config.lora.rank=16) trains adapters only: persistent state "
                f"{trial.phases['persistent'] / GIB:.1f} GiB per device"
            )
        if work.kl and not work.lora_rank:
            trial = fits(w=dataclasses.replace(work, kl=False))
            out.append(
                f"without the KL reference model (--config.loss.kl_coef=0) the persistent state is "
                f"{trial.phases['persistent'] / GIB:.1f} GiB per device"
            )
    if plan.phases["train"] > usable:
        w = work
        if not work.remat:
            w = dataclasses.replace(work, remat=True)
            trial = fits(w=w)
            out.append(
                f"turn on remat (--config.model.remat=true): training peak {trial.phases['train'] / GIB:.1f} GiB"
            )
        micros = (m for m in range(work.micro_batch_rows - 1, 0, -1) if work.mini_batch_rows % m == 0)
        smaller = ((m, fits(w=dataclasses.replace(w, micro_batch_rows=m))) for m in micros if m % shards == 0)
        hit = _first_fit(smaller, "train", usable)
        if hit:
            m, trial = hit
            out.append(
                f"smaller micro-batches (--config.train.micro_batch_rows={m}): training peak "
                f"{trial.phases['train'] / GIB:.1f} GiB"
            )
        else:
            out.append(_bigger_mesh_advice(cfg, label, sizes, w, hbm_gb, usable))
    if plan.phases["rollout"] > usable:
        chunks = (r for r in reversed(BATCH_BUCKETS) if r < work.rollout_rows and r % shards == 0)
        hit = _first_fit(
            ((r, fits(w=dataclasses.replace(work, rollout_rows=r))) for r in chunks), "rollout", usable
        )
        if hit:
            rows, trial = hit
            out.append(
                f"generate in chunks of {rows} rows (--config.rollout.max_rows_per_call={rows}): rollout "
                f"peak {trial.phases['rollout'] / GIB:.1f} GiB"
            )
        else:
            out.append(
                "the rollout does not fit even in small chunks: shorten max_prompt_tokens or add chips"
            )
    if not out and not plan.fits:
        out.append(f"no single change found; try more chips than {shards * sizes['tensor']}")
    return out


def _first_fit(trials: Iterable[tuple[Any, Plan]], phase: str, usable: float) -> tuple[Any, Plan] | None:
    """The first (change, plan) of ``trials`` whose ``phase`` fits in ``usable`` bytes (planned lazily)."""
    return next(((change, trial) for change, trial in trials if trial.phases[phase] <= usable), None)


def _bigger_mesh_advice(
    cfg: Qwen2Config, label: str, sizes: dict[str, int], work: Workload, hbm_gb: float, usable: float
) -> str:
    """Training does not fit at one row per batch shard: find the smallest larger mesh (more fsdp, or
    tensor parallelism on more chips) whose training phase fits, with its micro-batch size."""

    def trials() -> Iterator[tuple[tuple[dict[str, int], int], Plan]]:
        for k in (2, 4, 8, 16):
            for bigger in (dict(sizes, fsdp=sizes["fsdp"] * k), dict(sizes, tensor=sizes["tensor"] * k)):
                shards = bigger["data"] * bigger["fsdp"]
                for m in range(shards, work.mini_batch_rows + 1, shards):
                    if work.mini_batch_rows % m == 0:
                        micro = dataclasses.replace(work, micro_batch_rows=m)
                        yield (bigger, m), make_plan(cfg, label, bigger, micro, hbm_gb)

    hit = _first_fit(trials(), "train", usable)
    if hit is None:
        return "training does not fit even on 16x the chips: shorten rollout.max_prompt_tokens / max_response_tokens"
    (bigger, m), trial = hit
    mesh = ",".join(f"{a}:{v}" for a, v in bigger.items())
    chips = bigger["data"] * bigger["fsdp"] * bigger["tensor"]
    return (
        f"training does not fit on this mesh even at one row per batch shard; {chips} chips "
        f"with --mesh={mesh} and micro_batch_rows={m} give a training peak of "
        f"{trial.phases['train'] / GIB:.1f} GiB"
    )


# ---------------------------------------------------------------------------------------------- XLA


def loss_settings(config: Any) -> dict:
    """The trainer's loss options: ``config.loss``, which it passes to make_train_step as it is."""
    return config.loss.to_dict()


def xla_train_memory(cfg: Qwen2Config, sizes: dict[str, int], work: Workload, loss: dict) -> dict[str, int]:
    """Per-device bytes XLA reports for the project's compiled train step on this machine's devices.

    The step (``train_step.make_train_step``) is lowered for abstract state and one mini-batch and
    compiled, nothing is allocated. Run on the target accelerator (a TPU VM, a GPU host) this replaces
    the activation estimate with the compiler's own numbers; it needs as many local devices as the mesh.
    """
    from roleagent_jax.parallel.sharding import make_mesh
    from roleagent_jax.rl.logprobs import TARGET_KEY
    from roleagent_jax.rl.optimizer import TrainState
    from roleagent_jax.rl.train_step import make_train_step

    n = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
    if jax.device_count() != n:
        raise ValueError(
            f"--xla compiles for this machine's {jax.device_count()} devices but the mesh has {n}: "
            "run it on the target slice, or fake CPU devices with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n}"
        )
    mesh = make_mesh(sizes["data"], sizes["fsdp"], sizes["tensor"])
    if work.lora_rank:
        graphdef, params, base = abstract_lora(cfg, work)
    else:
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0))))
        params, base = abstract_params(cfg), None
    state = TrainState(
        params=params,
        opt_state=abstract_opt_state(params, work.optimizer),
        step=jax.ShapeDtypeStruct((), np.int32),
        rng=jax.ShapeDtypeStruct((2,), np.uint32),
    )
    rows, seq = work.mini_batch_rows, work.seq_len
    grid = {
        k: jax.ShapeDtypeStruct((rows, seq), np.int32) for k in ("input_ids", "attention_mask", "positions")
    }
    grid.update(
        {
            k: jax.ShapeDtypeStruct((rows, seq), np.float32)
            for k in ("loss_mask", "old_logprobs", "ref_logprobs")
        }
    )
    grid["advantages"] = jax.ShapeDtypeStruct((rows,), np.float32)
    if work.target_len:  # the head runs at the response columns, as pack_rows lays them out
        grid[TARGET_KEY] = jax.ShapeDtypeStruct((rows, min(work.target_len, seq)), np.int32)
    step = make_train_step(
        graphdef,
        make_optimizer(**work.optimizer),
        loss,
        mesh=mesh,
        micro_batches=rows // work.micro_batch_rows,
        remat=work.remat,
    )
    stats = step.lower(state, grid, base).compile().memory_analysis()  # its own jit, shardings, donation
    out = {
        name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0)
        for name in ("argument", "output", "alias", "temp", "generated_code")
    }
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def plan_from_config(
    config: Any,
    model: str = "",
    mesh: str = "data:1,fsdp:8,tensor:1",
    chip: str = "v4",
    hbm_gb: float | None = None,
    micro_batch_rows: int | None = None,
    remat: bool | None = None,
    param_dtype: str | None = None,
    xla: bool = False,
    shared_prefix: int = 0,
    lora_rank: int | None = None,
) -> Plan:
    """The whole planner as a function (the CLI's body)."""
    from roleagent_jax.config import apply_algo

    config = apply_algo(config)
    if hbm_gb is None:
        if chip not in CHIP_HBM_GB:
            raise ValueError(f"unknown chip {chip!r}: use one of {', '.join(CHIP_HBM_GB)} or give --hbm_gb")
        hbm_gb = CHIP_HBM_GB[chip]
    sizes = parse_mesh(mesh)
    cfg, label = model_config(model, config, param_dtype)
    if remat is not None:
        cfg = cfg.replace(remat=remat)
    if lora_rank is not None and lora_rank < 0:
        raise ValueError(f"--lora-rank={lora_rank}: must be >= 0 (0: full fine-tuning)")
    work = Workload.from_config(config, micro_batch_rows, remat, shared_prefix, lora_rank)
    if work.mini_batch_rows % work.micro_batch_rows:
        raise ValueError(
            f"micro_batch_rows {work.micro_batch_rows} must divide mini_batch_rows {work.mini_batch_rows}"
        )
    plan = make_plan(cfg, label, sizes, work, hbm_gb)
    plan.advice = [] if plan.fits else advise(cfg, label, sizes, work, hbm_gb, plan)
    if xla:
        plan.xla_train = xla_train_memory(cfg, sizes, work, loss_settings(config))
    return plan
