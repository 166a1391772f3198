"""The policy's weights as training holds them: the full model, or with LoRA small adapters that train
on a frozen base. The base is a non-donated train-step input and the KL reference (adapters at zero, no
second copy); the sampler gets a copy with the adapters merged into the kernels, made once per policy.
"""

from __future__ import annotations

import jax
from flax import nnx

from roleagent_jax.models import Qwen2ForCausalLM
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora, merge_fn
from roleagent_jax.sharding import shard_model


class PolicyWeights:
    """Splits a new model into what trains (`graphdef` + the params `split` returns) and what stays
    (`base`, with LoRA), and rebuilds the full model for sampling and export (`base_graphdef`)."""

    def __init__(self, model: Qwen2ForCausalLM, lora: LoRAConfig, seed: int, mesh):
        self.base_graphdef = nnx.graphdef(model)  # the model without adapters (warm start, export, sampling)
        self.base = None  # with LoRA: the frozen base, never updated by a train step
        if lora.rank:
            adapter_key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)  # not the base init's stream
            shard_model(add_lora(model, lora, nnx.Rngs(adapter_key)), mesh)
            self.graphdef, self._params, self.base = nnx.split(model, LoRAParam, ...)
        else:
            self.graphdef, self._params = nnx.split(model)
        self._merge = merge_fn(self.graphdef) if self.base is not None else None
        self._copy = None  # with LoRA: (step, id of the base, merged params) of the policy

    @property
    def lora(self) -> bool:
        return self.base is not None

    def take_params(self):
        """The trained params of the new model, handed over once (no second reference is kept)."""
        params, self._params = self._params, None
        return params

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

    def model(self, params) -> Qwen2ForCausalLM:
        """The policy as a model (with its adapters when LoRA trains)."""
        return (
            nnx.merge(self.graphdef, params) if not self.lora else nnx.merge(self.graphdef, params, self.base)
        )
