"""Batched generation for all roles of the policy; see `sampler.Sampler`."""

from roleagent_jax.sampling.choose import choose_tokens
from roleagent_jax.sampling.sampler import (
    FINISH_REASONS,
    Sampler,
    SampleRequest,
    SampleResult,
    SamplingParams,
)

__all__ = ["FINISH_REASONS", "SampleRequest", "SampleResult", "Sampler", "SamplingParams", "choose_tokens"]
