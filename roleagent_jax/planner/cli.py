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

import json
import re
import sys

from roleagent_jax.planner.advice import CHIP_HBM_GB, plan_from_config
from roleagent_jax.planner.memory import (
    GIB,
    USABLE_FRACTION,
    Plan,
)

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
