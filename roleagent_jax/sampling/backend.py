"""The rollout backend: what the trainer, the evaluation policy and AIW's analyst need from whatever turns
prompts into text. Three calls (new weights in, answers out, log-probs of given answers), so a second
backend (a server-side engine, an asynchronous rollout worker) plugs in behind `make_backend` without
the callers changing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from roleagent_jax import distributed
from roleagent_jax.sampling.sampler import (
    BATCH_BUCKETS,
    Sampler,
    SampleRequest,
    SampleResult,
    SamplingParams,
)
from roleagent_jax.train_step import make_logprob_fn


class RolloutBackend(Protocol):
    """Generation for every role of the policy, with the weights it was last given."""

    def update_weights(self, params: Any) -> None:
        """The weights of the next calls (the full model: with LoRA, the merged copy)."""

    def generate(
        self, requests: Sequence[SampleRequest], sampling: SamplingParams, key: jax.Array
    ) -> list[SampleResult]:
        """One batched call: every request answered, in order."""

    def logprobs(self, batch: Mapping[str, np.ndarray], params: Any = None) -> np.ndarray:
        """Token log-probs [B, T] of a `train_step.pack_rows` grid under the current weights (or
        `params`, e.g. the KL reference), 0 on padding."""


class JaxBackend:
    """The in-process backend: the jitted KV-cache `Sampler` and a jitted log-prob pass over the same
    mesh as training, so new weights are a pointer swap, not a copy."""

    def __init__(self, graphdef, model_config, tokenizer, mesh=None, *, eos_ids: Sequence[int] | None = None,
                 batch_buckets: Sequence[int] = BATCH_BUCKETS, micro_batches: int = 1):  # fmt: skip
        self.sampler = Sampler(
            graphdef, model_config, tokenizer, mesh, eos_ids=eos_ids, batch_buckets=batch_buckets
        )
        self.graphdef, self.mesh, self.micro_batches = graphdef, mesh, micro_batches
        self.params = None
        self._logprob_fn = None  # built on first use: an evaluation-only backend never compiles it

    def update_weights(self, params: Any) -> None:
        self.params = params

    def generate(
        self, requests: Sequence[SampleRequest], sampling: SamplingParams, key: jax.Array
    ) -> list[SampleResult]:
        if self.params is None:
            raise RuntimeError("the rollout backend has no weights yet: call update_weights first")
        return self.sampler.generate(self.params, requests, sampling, key)

    def logprobs(self, batch: Mapping[str, np.ndarray], params: Any = None) -> np.ndarray:
        if self._logprob_fn is None:
            self._logprob_fn = make_logprob_fn(
                self.graphdef, mesh=self.mesh, micro_batches=self.micro_batches
            )
        weights = self.params if params is None else params
        return np.asarray(distributed.fetch(self._logprob_fn(weights, batch)))


BACKENDS: dict[str, Callable[..., RolloutBackend]] = {"jax": JaxBackend}


def make_backend(name: str, graphdef, model_config, tokenizer, mesh=None, **options: Any) -> RolloutBackend:
    """The backend registered under `name` (`BACKENDS`), built for this model and tokenizer."""
    if name not in BACKENDS:
        raise ValueError(f"unknown rollout backend {name!r}: one of {', '.join(BACKENDS)}")
    return BACKENDS[name](graphdef, model_config, tokenizer, mesh, **options)
