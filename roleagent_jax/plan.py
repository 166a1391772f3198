"""Per-device memory plan of a run, from abstract shapes: will it fit, and if not, what to change.

    python -m roleagent_jax.plan --config=configs/alfworld.py --mesh=data:1,fsdp:8,tensor:1 --model=1.5b
    python -m roleagent_jax.plan --config=configs/alfworld.py --mesh=data:1,fsdp:4,tensor:2 --model=7b \\
        --chip=v5e --micro-batch-rows=8

Parameters and optimizer state are counted exactly: the model and ``optimizer.init`` are traced with
``nnx.eval_shape`` / ``jax.eval_shape`` (no weights are made) and every leaf is divided by the mesh axes
its partition rule (``sharding.PARTITION_RULES``) puts on it. The KV cache is ``init_cache``'s abstract
shape for one sampler call; with ``--shared-prefix-tokens=N`` (rows of one task group share their
prompts' first N tokens) it is the sampler's shared-prefix layout, chosen by the sampler's own planner
(``sampling.prefix.plan_layout``): one prefix cache per group plus each row's own slots. Activations
are an estimate (formula in ``activation_bytes`` and docs/scaling.md). The last line printed is a JSON
object with every number.

With LoRA (``--lora-rank=R`` or the config's ``lora.rank``) the base is counted in its storage dtype
beside float32 adapters; optimizer state and gradients are the adapters' only, and the KL reference
costs nothing (it is the base with the adapters off).

Flags: --config (a trainer config; --config.<key>=<value> overrides), --mesh, --model, --chip or
--hbm-gb, --micro-batch-rows, --remat, --param-dtype, --shared-prefix-tokens, --lora-rank, --xla.

Documentation: README.md (quick start, configuration, real runs), configs/base.py (every key with its
meaning and default), docs/ (experiments.md, scaling.md, adding-an-environment.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
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
    Workload,
    abstract_lora,
    abstract_mesh,
    abstract_opt_state,
    abstract_params,
    activation_bytes,
    device_bytes,
    kv_cache_bytes,
    logprob_bytes,
    make_plan,
    parse_mesh,
    prefill_bytes,
    rollout_layout,
    tree_bytes,
)
from roleagent_jax.rl.optimizer import make_optimizer
from roleagent_jax.sampling.sampler import BATCH_BUCKETS

__all__ = [
    "BUILTIN_MODELS",
    "CHIP_HBM_GB",
    "GIB",
    "USABLE_FRACTION",
    "Plan",
    "Workload",
    "abstract_lora",
    "abstract_mesh",
    "abstract_opt_state",
    "abstract_params",
    "activation_bytes",
    "advise",
    "device_bytes",
    "format_table",
    "kv_cache_bytes",
    "logprob_bytes",
    "loss_settings",
    "make_plan",
    "model_config",
    "parse_mesh",
    "plan_from_config",
    "prefill_bytes",
    "rollout_layout",
    "tree_bytes",
    "xla_train_memory",
]


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


# ---------------------------------------------------------------------------------------------- output


def _gib(n: int) -> str:
    return f"{n / GIB:9.2f}"


def format_table(plan: Plan) -> str:
    mesh = ",".join(f"{k}:{v}" for k, v in plan.mesh.items())
    lines = [
        f"model {plan.model} ({plan.params_total / 1e9:.3f}B params), mesh {mesh}, "
        f"HBM {plan.hbm_gb:g} GiB/device (plan within {USABLE_FRACTION:.0%})",
        "",
        f"| {'component':28s} | {'global GiB':>10s} | {'per device GiB':>14s} | note",
        f"|{'-' * 30}|{'-' * 12}|{'-' * 16}|{'-' * 40}",
    ]
    for name, g, dev, note in plan.rows:
        lines.append(f"| {name:28s} | {_gib(g):>10s} | {_gib(dev):>14s} | {note}")
    lines.append("")
    for phase, value in plan.phases.items():
        lines.append(f"{phase:>10s} peak per device: {value / GIB:8.2f} GiB")
    if plan.xla_train:
        x = plan.xla_train
        lines.append(
            f"XLA train step per device: arguments {x['argument'] / GIB:.2f}, temporaries "
            f"{x['temp'] / GIB:.2f}, total {x['total'] / GIB:.2f} GiB (compiled here)"
        )
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines.append(
        f"{'peak':>10s}: {plan.peak / GIB:.2f} GiB of {plan.hbm_gb * USABLE_FRACTION:.1f} usable -> {verdict}"
    )
    for a in plan.advice:
        lines.append(f"  advice: {a}")
    return "\n".join(lines)


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


def main(argv: list[str]) -> int:
    from absl import flags
    from ml_collections import config_flags

    del argv
    cfg_flag = config_flags.DEFINE_config_file("config", "configs/alfworld.py", "Trainer config file.")
    mesh = flags.DEFINE_string(
        "mesh", "data:1,fsdp:8,tensor:1", "Mesh axis sizes, e.g. data:1,fsdp:4,tensor:2."
    )
    model = flags.DEFINE_string(
        "model",
        "",
        "135m | 0.5b | 1.5b | 7b | a config.json or checkpoint dir; "
        "default: the config's model.path, else its random-init model.",
    )
    chip = flags.DEFINE_enum("chip", "v4", list(CHIP_HBM_GB), "Accelerator, for its HBM per device.")
    hbm = flags.DEFINE_float("hbm_gb", None, "HBM per device in GiB (overrides --chip).")
    micro = flags.DEFINE_integer("micro_batch_rows", None, "Rows per micro-batch (default: the config's).")
    remat = flags.DEFINE_bool("remat", None, "Override config.model.remat.")
    pdt = flags.DEFINE_enum("param_dtype", None, ["float32", "bfloat16"], "Override the stored weight dtype.")
    xla = flags.DEFINE_bool(
        "xla",
        False,
        "Also compile the real train step on this machine's devices and "
        "print XLA's per-device memory (needs as many devices as the mesh).",
    )
    shared = flags.DEFINE_integer(
        "shared_prefix_tokens",
        0,
        "Prompt tokens the rows of a task group share (e.g. max_prompt_tokens - 1 for a group's "
        "identical first prompts): plan the sampler's shared-prefix layout. 0: every row its own.",
    )
    lora_rank = flags.DEFINE_integer(
        "lora_rank", None, "LoRA adapters' rank (0: full fine-tuning; default: the config's lora.rank)."
    )
    if any(a in ("-h", "--help", "--helpshort") for a in sys.argv[1:]):
        print(__doc__.strip() + "\n\nflags:\n" + flags.FLAGS.main_module_help())
        return 0
    flags.FLAGS(_normalise(sys.argv))
    try:
        plan = plan_from_config(
            cfg_flag.value,
            model.value,
            mesh.value,
            chip.value,
            hbm.value,
            micro.value,
            remat.value,
            pdt.value,
            xla.value,
            shared.value,
            lora_rank.value,
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(plan))
    print(json.dumps(plan.to_json()))
    return 0


def _normalise(argv: list[str]) -> list[str]:
    """Accept --micro-batch-rows / --hbm-gb / --param-dtype / --shared-prefix-tokens / --lora-rank
    spellings as well as underscores."""
    return [
        re.sub(
            r"^--(micro-batch-rows|hbm-gb|param-dtype|shared-prefix-tokens|lora-rank)",
            lambda m: "--" + m.group(1).replace("-", "_"),
            a,
        )
        for a in argv
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
