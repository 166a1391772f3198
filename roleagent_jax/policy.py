"""A trained model as an evaluation policy: `python -m roleagent_jax.evaluate --checkpoint=DIR`.

DIR is a Hugging Face directory written by the trainer (`<workdir>/hf_final`, `hf_warmstart`) or any
Qwen2 checkpoint with its tokenizer; `roleagent.json` beside the weights, when present, carries the prompt
settings the model was trained with (history window, token budgets).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
from flax import nnx

from roleagent_jax.envs.base import Family
from roleagent_jax.models import load_pretrained
from roleagent_jax.sampling import SampleRequest, SamplingParams
from roleagent_jax.sampling.backend import make_backend
from roleagent_jax.tokenizer import PromptEncoder, eos_ids, load_tokenizer

PROMPT_SETTINGS = "roleagent.json"
DEFAULTS = {"history_k": 2, "max_prompt_tokens": 2048, "max_response_tokens": 512}


def write_prompt_settings(directory: str | Path, **settings) -> None:
    (Path(directory) / PROMPT_SETTINGS).write_text(json.dumps({**DEFAULTS, **settings}, indent=1))


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
    ):
        """``settings`` override the prompt settings (``DEFAULTS`` keys) the checkpoint carries."""
        path = Path(checkpoint)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"no model checkpoint at {path}: expected a Hugging Face directory with config.json and "
                "*.safetensors (e.g. <workdir>/hf_final written at the end of training)"
            )
        settings_file = path / PROMPT_SETTINGS
        self.settings = {
            **DEFAULTS,
            **(json.loads(settings_file.read_text()) if settings_file.exists() else {}),
            **(settings or {}),
        }
        self.family = family
        self.history_k = int(self.settings["history_k"])
        model, config = load_pretrained(path)
        self.tokenizer = load_tokenizer(path)
        self.encode = PromptEncoder(self.tokenizer, self.settings["max_prompt_tokens"])  # as the rollout does
        graphdef, params = nnx.split(model)
        self.backend = make_backend("jax", graphdef, config, self.tokenizer, eos_ids=eos_ids(self.tokenizer))
        self.backend.update_weights(params)
        self.sampling = SamplingParams(temperature=temperature)
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
