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
    """What trains (`graphdef`, over the params `split` hands back) and what stays (`base`, with LoRA), and
    the full model rebuilt for sampling and export (`base_graphdef`)."""

    def __init__(self, base_graphdef: nnx.GraphDef, graphdef: nnx.GraphDef, base=None):
        self.base_graphdef = base_graphdef  # the model without adapters (warm start, export, sampling)
        self.graphdef = graphdef
        self.base = base  # with LoRA: the frozen base, never updated by a train step
        self._merge = merge_fn(graphdef) if base is not None else None
        self._copy = None  # with LoRA: (step, id of the base, merged params) of the policy

    @classmethod
    def split(
        cls, model: Qwen2ForCausalLM, lora: LoRAConfig, seed: int, mesh
    ) -> tuple[PolicyWeights, nnx.State]:
        """The weights of a new model and its trained params (all of them, or the new adapters)."""
        base_graphdef = nnx.graphdef(model)
        if not lora.rank:
            graphdef, params = nnx.split(model)
            return cls(base_graphdef, graphdef), params
        adapter_key = jax.random.fold_in(jax.random.PRNGKey(seed), 1)  # not the base init's stream
        shard_model(add_lora(model, lora, nnx.Rngs(adapter_key)), mesh)
        graphdef, params, base = nnx.split(model, LoRAParam, ...)
        return cls(base_graphdef, graphdef, base), params

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

    def model(self, params) -> Qwen2ForCausalLM:
        """The policy as a model (with its adapters when LoRA trains)."""
        return (
            nnx.merge(self.graphdef, params) if not self.lora else nnx.merge(self.graphdef, params, self.base)
        )
