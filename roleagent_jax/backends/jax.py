"""The in-process rollout backend: the jitted KV-cache `Sampler` on the same mesh as training, so new
weights are a pointer swap, not a copy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from roleagent_jax.sampling.plan import BATCH_BUCKETS
from roleagent_jax.sampling.requests import SampleRequest, SampleResult, SamplingParams
from roleagent_jax.sampling.sampler import Sampler


class JaxBackend:
    """`RolloutBackend` through the jitted KV-cache `Sampler`."""

    def __init__(self, graphdef, model_config, tokenizer, mesh=None, *, eos_ids: Sequence[int] | None = None,
                 batch_buckets: Sequence[int] = BATCH_BUCKETS):  # fmt: skip
        self.sampler = Sampler(
            graphdef, model_config, tokenizer, mesh, eos_ids=eos_ids, batch_buckets=batch_buckets
        )
        self.params = None

    def update_weights(self, params: Any) -> None:
        self.params = params

    def generate(
        self, requests: Sequence[SampleRequest], sampling: SamplingParams, key: jax.Array
    ) -> list[SampleResult]:
        if self.params is None:
            raise RuntimeError("the rollout backend has no weights yet: call update_weights first")
        return self.sampler.generate(self.params, requests, sampling, key)

    def stats(self) -> dict[str, float]:
        """Running totals: the sampler's seconds in prefill and in decode, and the programs it compiled."""
        s = self.sampler
        return {"time_prefill": s.seconds["prefill"], "time_decode": s.seconds["decode"],
                "compilations": float(s.num_compilations)}  # fmt: skip
