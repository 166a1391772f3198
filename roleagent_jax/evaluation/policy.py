"""A trained model as an evaluation policy: `python -m roleagent_jax.evaluate --checkpoint=DIR`.

DIR is a Hugging Face directory written by the trainer (`<workdir>/hf_final`, `hf_warmstart`) or any
Qwen2 checkpoint with its tokenizer; `roleagent.json` beside the weights, when present, carries what the
model was trained with (`trained_settings`): here the prompt settings (history window, token budgets)
and the sampler's largest call.
"""

from __future__ import annotations

from pathlib import Path

import jax
from flax import nnx

from roleagent_jax.backends import make_backend
from roleagent_jax.config import CONFIG
from roleagent_jax.envs.base import Family
from roleagent_jax.evaluation.trained_settings import POLICY_DEFAULTS as DEFAULTS
from roleagent_jax.evaluation.trained_settings import check_checkpoint, read_settings
from roleagent_jax.models import load_pretrained
from roleagent_jax.models.tokenizer import PromptEncoder, eos_ids, load_tokenizer
from roleagent_jax.sampling import SampleRequest, SamplingParams, capped_batch_buckets


class ModelPolicy:
    """Batched agent responses from the model through the rollout backend (one call per step).

    The episode loop builds each turn's prompt with the family's builder and this policy's `history_k`,
    exactly as training rollouts do."""

    needs_expert_plan = False

    def __init__(
        self,
        checkpoint: str | Path,
        family: Family,
        temperature: float = 0.4,
        seed: int = 0,
        settings: dict | None = None,
        greedy: bool = False,
        backend: str | None = None,
    ):
        """``settings`` override the prompt and sampler settings (``DEFAULTS`` keys) the checkpoint
        carries; ``backend`` is a rollout backend's name (default: the ``rollout.backend`` key's)."""
        path = Path(checkpoint)
        check_checkpoint(path)
        trained = read_settings(path)
        self.settings = {**DEFAULTS, **{k: trained[k] for k in DEFAULTS if k in trained}, **(settings or {})}
        self.family = family
        self.history_k = int(self.settings["history_k"])
        model, config = load_pretrained(path)
        self.tokenizer = load_tokenizer(path)
        self.encode = PromptEncoder(self.tokenizer, self.settings["max_prompt_tokens"])  # as the rollout does
        graphdef, params = nnx.split(model)
        self.backend = make_backend(
            backend or CONFIG.default("rollout.backend"),
            graphdef,
            config,
            self.tokenizer,
            eos_ids=eos_ids(self.tokenizer),
            batch_buckets=capped_batch_buckets(int(self.settings["max_rows_per_call"])),
        )
        self.backend.update_weights(params)
        self.sampling = SamplingParams(temperature=temperature, greedy=greedy)
        self.key = jax.random.PRNGKey(seed)
        self.calls = 0

    def __call__(self, batch) -> list[str]:
        requests = [
            SampleRequest(
                self.encode(x.prompt), self.settings["max_response_tokens"], stop=(self.family.action_stop,)
            )
            for x in batch
        ]
        self.calls += 1
        results = self.backend.generate(requests, self.sampling, jax.random.fold_in(self.key, self.calls))
        return [r.text for r in results]
