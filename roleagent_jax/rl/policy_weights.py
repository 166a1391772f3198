"""The policy's weights as training holds them: the full model, or with LoRA small adapters that train
on a frozen base. The base is a non-donated train-step input and the KL reference (adapters at zero, no
second copy); the sampler gets a copy with the adapters merged into the kernels, made once per policy.

Every question whose answer depends on LoRA is answered here, so the trainer asks none: the weights to
sample with, what the warm start trains, the KL reference, what a resumed run reloads, what is exported.
"""

from __future__ import annotations

from pathlib import Path

import jax
from flax import nnx

from roleagent_jax.models import Qwen2ForCausalLM, save_pretrained
from roleagent_jax.models.hf_io import umask_mode
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora, merge_fn
from roleagent_jax.models.peft_io import save_adapter
from roleagent_jax.parallel.sharding import shard_model


class PolicyWeights:
    """What trains (`graphdef`, over the params `split` hands back) and what stays (`base`, with LoRA), and
    the full model rebuilt for sampling and export (`base_graphdef`)."""

    def __init__(self, base_graphdef: nnx.GraphDef, graphdef: nnx.GraphDef, base=None, base_dir: str = ""):
        self.base_graphdef = base_graphdef  # the model without adapters (warm start, export, sampling)
        self.graphdef = graphdef
        self.base = base  # with LoRA: the frozen base, never updated by a train step
        self.base_dir = base_dir  # with LoRA: the directory of the base (the checkpoint and adapter name it)
        self.reference = None  # full fine-tuning with a KL term: the reference params (`keep_reference`)
        self._merge = merge_fn(graphdef) if base is not None else None
        self._copy = None  # with LoRA: (step, id of the base, merged params) of the policy

    @classmethod
    def split(
        cls, model: Qwen2ForCausalLM, lora: LoRAConfig, seed: int, mesh, base_dir: str = ""
    ) -> tuple[PolicyWeights, nnx.State]:
        """The weights of a new model (read from `base_dir`) and its trained params (all of them, or the
        new adapters)."""
        base_graphdef = nnx.graphdef(model)
        if not lora.rank:
            graphdef, params = nnx.split(model)
            return cls(base_graphdef, graphdef, base_dir=base_dir), params
        adapter_key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)  # not the base init's stream
        shard_model(add_lora(model, lora, nnx.Rngs(adapter_key)), mesh)
        graphdef, params, base = nnx.split(model, LoRAParam, ...)
        return cls(base_graphdef, graphdef, base, base_dir), params

    @property
    def lora(self) -> bool:
        return self.base is not None

    def sampling(self, params, step: int):
        """The full weights the sampler runs: `params`, or with LoRA the base with the adapters merged
        (it decodes faster than applying the adapters in every projection: docs/scaling.md), kept
        until the policy (its step) or the base changes."""
        if not self.lora:
            return params
        if self._copy is None or self._copy[:2] != (step, id(self.base)):
            self._copy = None  # free the old copy before making the new one
            self._copy = (step, id(self.base), self._merge(params, self.base))
        return self._copy[2]

    def drop_sampling_copy(self) -> None:
        """Free the merged copy: an update needs the memory more."""
        self._copy = None

    # ------------------------------------------------------------------ the KL reference

    def keep_reference(self, params, kl: bool) -> None:
        """Full fine-tuning with a KL term (`kl`) keeps `params` (the starting model) as its reference;
        with LoRA the base is the reference and nothing more is kept."""
        self.reference = params if kl and not self.lora else None

    @property
    def kl_reference(self):
        """The full weights the KL term compares with: the LoRA base, or the kept reference."""
        return self.base if self.lora else self.reference

    # ------------------------------------------------------------------ the warm start

    def warm_start_weights(self, params) -> tuple[nnx.GraphDef, nnx.State]:
        """(graphdef, params) of the whole model the supervised warm start trains: with LoRA the base
        (before any adapter trains), else the policy's `params`."""
        return (self.base_graphdef, self.base) if self.lora else (self.graphdef, params)

    def take_warm_start(self, params, directory: str) -> nnx.State | None:
        """The warm start's result, exported to `directory`. With LoRA it is the new base, and so the
        reference; fresh adapters train on it and None is returned. Else it is the new trained params,
        returned for a new train state (and the reference follows it, when one is kept)."""
        if self.lora:
            self.base, self.base_dir = params, directory
            return None
        if self.reference is not None:
            self.reference = params
        return params

    # ------------------------------------------------------------------ checkpoints and export

    def host_state(self) -> dict:
        """What a checkpoint records of the weights: with LoRA the base its adapters belong to."""
        return {"lora_base": self.base_dir} if self.lora else {}

    def frozen_source(self, host: dict, warm_dir: Path) -> str | Path | None:
        """Where a run resumed from a checkpoint (its `host` record) reloads frozen weights from, or None
        when what it built is right: with LoRA the base the checkpoint names, when a warm start replaced
        the one it starts from; else the warm-started model in `warm_dir`, when a reference is kept."""
        if self.lora:
            return host["lora_base"] if host["lora_base"] != self.base_dir else None
        if self.reference is not None and host["warm_started"] and warm_dir.is_dir():
            return warm_dir
        return None

    def load_frozen(self, params, source: str | Path) -> None:
        """Frozen weights read from `source` (`frozen_source`): the LoRA base, or the KL reference."""
        if self.lora:
            self.base, self.base_dir = params, str(source)
        else:
            self.reference = params

    def export(self, params, directory: Path, tokenizer, fix_modes: bool) -> None:
        """The policy as a Hugging Face model in `directory` (adapters merged into the kernels); with
        LoRA also the peft adapter in `directory / "adapter"`, naming its base. `fix_modes`: make the
        adapter's files readable as the others (safetensors writes owner-only files)."""
        model = self.model(params)
        save_pretrained(model, directory, tokenizer=tokenizer)
        if self.lora:
            save_adapter(model, directory / "adapter", self.base_dir)
            if fix_modes:
                for path in (directory / "adapter").iterdir():
                    umask_mode(path)

    def model(self, params) -> Qwen2ForCausalLM:
        """The policy as a model (with its adapters when LoRA trains)."""
        return (
            nnx.merge(self.graphdef, params) if not self.lora else nnx.merge(self.graphdef, params, self.base)
        )
