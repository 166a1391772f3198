"""The rollout backend: what the trainer, the evaluation policy and AIW's analyst need from whatever turns
prompts into text. Two calls (new weights in, answers out), so a second backend (a server-side engine,
an asynchronous rollout worker) plugs in behind `make_backend` without the callers changing. The
update's old log-probs come from the trainer's own forward pass (`train.old_logprobs=recompute`) or
from a backend's answers (`sampler`): the log-probs of the tokens it sampled and of the prompt tokens a
request asks it to score (`SampleRequest.score_tokens`: forced tokens that are trained), both
log_softmax of the policy's raw logits, as the trainer computes them. The reference's never come from a
backend.

A backend may also say where its time goes with a `stats()` method (not part of the protocol, which
every backend meets without it): running totals since it was built, seconds under `time_<phase>` keys
(the jax backend: `time_prefill`, `time_decode`) and counts under others (`compilations`). The rollout
logs how much each grew while it played (`FoldedCalls` passes them on).

The registry names each backend's class by module and attribute, so the config reads the names and
a run imports only the backend it uses.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import jax

    from roleagent_jax.sampling import SampleRequest, SampleResult, SamplingParams


class RolloutBackend(Protocol):
    """Generation for every role of the policy, with the weights it was last given."""

    def update_weights(self, params: Any) -> None:
        """The weights of the next calls (the full model: with LoRA, the merged copy); None frees them."""

    def generate(
        self, requests: Sequence[SampleRequest], sampling: SamplingParams, key: jax.Array
    ) -> list[SampleResult]:
        """One batched call: every request answered, in order, with the log-probs of its sampled tokens
        and of its `score_tokens` last prompt tokens (`SampleResult.prompt_logprobs`)."""


# name -> "module:class"; the class is built as cls(graphdef, model_config, tokenizer, mesh, **options).
BACKENDS: dict[str, str] = {"jax": "roleagent_jax.backends.jax:JaxBackend"}


class FoldedCalls:
    """`backend.generate` as one callable of the requests, each call with its own fold of `key` (the
    n-th call's key is ``fold_in(key, n)``, so one phase's samples do not depend on another's calls);
    `stats` is the backend's (empty for a backend without one)."""

    def __init__(self, backend: RolloutBackend, sampling: SamplingParams, key: jax.Array) -> None:
        self.backend, self.sampling, self.key, self.calls = backend, sampling, key, 0

    def __call__(self, requests: Sequence[SampleRequest]) -> list[SampleResult]:
        import jax  # at call time: the config reads the registry without loading JAX

        self.calls += 1
        return self.backend.generate(requests, self.sampling, jax.random.fold_in(self.key, self.calls))

    def stats(self) -> dict[str, float]:
        stats = getattr(self.backend, "stats", None)
        return dict(stats()) if stats is not None else {}


def make_backend(name: str, graphdef, model_config, tokenizer, mesh=None, **options: Any) -> RolloutBackend:
    """The backend registered under `name` (`BACKENDS`), built for this model and tokenizer."""
    if name not in BACKENDS:
        raise ValueError(f"unknown rollout backend {name!r}: one of {', '.join(BACKENDS)}")
    module, _, attr = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)(graphdef, model_config, tokenizer, mesh, **options)
