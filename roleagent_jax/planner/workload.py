"""What a run asks of the devices, read from its config: the mesh's axis sizes and the workload (rows,
lengths, micro-batches, LoRA, optimizer settings) the memory plan counts bytes for."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from roleagent_jax.parallel.sharding import AXES
from roleagent_jax.rl.logprobs import TARGET_BUCKET, round_up
from roleagent_jax.sampling.plan import PROMPT_BUCKETS, capped_batch_buckets

GIB = 1024**3
# Share of HBM a plan may use: the runtime, XLA's scratch space and fragmentation take the rest.
USABLE_FRACTION = 0.9


def parse_mesh(text: str) -> dict[str, int]:
    """``"data:1,fsdp:8,tensor:1"`` -> sizes of the three mesh axes (missing axes are 1)."""
    sizes = dict.fromkeys(AXES, 1)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition(":")
        if not sep or name not in sizes or not value.isdigit() or int(value) < 1:
            raise ValueError(f"bad mesh {text!r}: use e.g. data:1,fsdp:8,tensor:1 (axes {', '.join(AXES)})")
        sizes[name] = int(value)
    return sizes


def abstract_mesh(sizes: dict[str, int]) -> jax.sharding.AbstractMesh:
    """A device-free mesh of the given axis sizes (enough for partition rules and sizes)."""
    return jax.sharding.AbstractMesh(tuple(sizes[a] for a in AXES), AXES)


@dataclasses.dataclass(frozen=True)
class Workload:
    """The shapes a run pushes through the devices, read from the trainer config."""

    rollout_rows: int  # rows in one sampler call (agent + predictor prompts)
    prompt_len: int  # prompt bucket of that call
    cache_len: int  # KV slots per row: prompt bucket + new tokens
    micro_batch_rows: int  # rows per gradient micro-batch
    mini_batch_rows: int
    seq_len: int  # training row length (prompt + response)
    kl: bool  # a frozen reference model is kept
    remat: bool
    optimizer: dict
    prompt_tokens: int = 0  # longest prompt (max_prompt_tokens)
    task_groups: int = 0  # rollout groups (tasks) in a call
    group_size: int = 0  # agent rows per group
    predictor_rows: int = 0  # WIA predictor rows per group
    shared_prefix: int = 0  # prompt tokens the rows of a group share (0: plan the plain layout)
    lora_rank: int = 0  # adapters' rank (0: full fine-tuning)
    lora_targets: tuple[str, ...] = ()
    lora_layers: int = 0  # adapters on the top k layers only (0: every layer)
    target_len: int = 0  # tokens per row the LM head runs at (the response; 0: the whole row)

    @classmethod
    def from_config(
        cls,
        config: Any,
        micro_batch_rows: int | None = None,
        remat: bool | None = None,
        shared_prefix: int = 0,
        lora_rank: int | None = None,
    ) -> Workload:
        r, c = config.rollout, config
        if not 0 <= shared_prefix < r.max_prompt_tokens:
            raise ValueError(
                f"shared prefix tokens must be in [0, max_prompt_tokens={r.max_prompt_tokens}), got {shared_prefix}"
            )
        rows = r.tasks_per_iter * r.group_size
        wia_mode = "off" if c.algo in ("grpo", "gigpo") else c.wia.mode
        predictors = math.ceil(r.group_size * c.wia.fraction) if wia_mode == "separate" else 0
        if wia_mode == "separate":
            rows += math.ceil(rows * c.wia.fraction)  # predictor prompts ride in the same call
        buckets = capped_batch_buckets(r.max_rows_per_call)  # one call holds at most the largest
        rows = next(b for b in buckets if b >= min(rows, buckets[-1]))
        prompt = next((b for b in PROMPT_BUCKETS if b >= r.max_prompt_tokens), r.max_prompt_tokens)
        new = max(r.max_response_tokens, c.wia.max_tokens if wia_mode == "separate" else 0)
        trained = max(r.max_response_tokens, c.wia.max_tokens * c.wia.train_predictor)  # as the trainer packs
        kl = c.loss.kl_type != "none" and c.loss.kl_coef > 0
        opt = dict(
            lr=c.optim.lr,
            weight_decay=c.optim.weight_decay,
            grad_clip=c.optim.grad_clip,
            warmup_steps=c.optim.warmup_steps,
            schedule=c.optim.schedule,
            total_steps=max(c.iterations, 1),
        )
        return cls(
            rollout_rows=rows,
            prompt_len=prompt,
            cache_len=prompt + new,
            micro_batch_rows=micro_batch_rows or c.train.micro_batch_rows,
            mini_batch_rows=c.train.mini_batch_rows,
            seq_len=r.max_prompt_tokens + r.max_response_tokens,
            kl=kl,
            remat=c.model.remat if remat is None else remat,
            optimizer=opt,
            prompt_tokens=r.max_prompt_tokens,
            task_groups=r.tasks_per_iter,
            group_size=r.group_size,
            predictor_rows=predictors,
            shared_prefix=shared_prefix,
            lora_rank=c.lora.rank if lora_rank is None else lora_rank,
            lora_targets=tuple(c.lora.targets),
            lora_layers=c.lora.layers,
            target_len=round_up(trained, TARGET_BUCKET),
        )
