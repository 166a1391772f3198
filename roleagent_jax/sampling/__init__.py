"""Batched generation for all roles of the policy; see `sampler.Sampler`."""

from roleagent_jax.sampling.choose import choose_tokens
from roleagent_jax.sampling.plan import BATCH_BUCKETS, capped_batch_buckets
from roleagent_jax.sampling.requests import FINISH_REASONS, SampleRequest, SampleResult, SamplingParams
from roleagent_jax.sampling.sampler import Sampler

__all__ = [
    "BATCH_BUCKETS",
    "FINISH_REASONS",
    "SampleRequest",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "capped_batch_buckets",
    "choose_tokens",
]
