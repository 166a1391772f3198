"""`ModelPolicy` (what `evaluate --checkpoint` plays with) samples as the run did: the sampler's row cap
that the run's export carries bounds every call, and the responses do not depend on it (greedy)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

TEXTS = [
    "<search>Lotarar</search>",
    "<answer>Dozo</answer>",
    "In what year was the capital of Lotarar founded?",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A 1-layer transformers Qwen2 with its own tokenizer, as a Hugging Face folder."""
    import torch
    from qwen2_tiny import one_layer_fields
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roleagent_jax.models.tokenizer import train_bpe_tokenizer

    directory = tmp_path_factory.mktemp("model")
    tok = train_bpe_tokenizer(TEXTS * 8, 300, directory)
    torch.manual_seed(0)
    fields = one_layer_fields(vocab_size=len(tok), max_position_embeddings=512, eos_token_id=tok.eos_token_id)
    Qwen2ForCausalLM(Qwen2Config(**fields)).save_pretrained(directory)
    return directory


def _policy(checkpoint: Path, max_rows: int | None, monkeypatch, calls: list[int]):
    from roleagent_jax.envs import get_family
    from roleagent_jax.evaluation.policy import ModelPolicy
    from roleagent_jax.sampling.sampler import Sampler

    settings = {"history_k": 1, "max_prompt_tokens": 64, "max_response_tokens": 6}
    if max_rows is not None:
        settings["max_rows_per_call"] = max_rows
    (checkpoint / "roleagent.json").write_text(json.dumps(settings))
    chunk = Sampler._generate_chunk

    def recorded(self, params, requests, *args, **kwargs):
        calls.append(len(requests))
        return chunk(self, params, requests, *args, **kwargs)

    monkeypatch.setattr(Sampler, "_generate_chunk", recorded)
    return ModelPolicy(checkpoint, get_family("search_qa"), greedy=True)


def test_the_exported_row_cap_bounds_every_sampler_call(checkpoint, monkeypatch):
    turns = [SimpleNamespace(prompt=f"{TEXTS[i % 3]} {i}") for i in range(20)]
    capped_calls: list[int] = []
    capped = _policy(checkpoint, 8, monkeypatch, capped_calls)(turns)
    assert capped_calls == [8, 8, 4]
    whole_calls: list[int] = []
    whole = _policy(checkpoint, None, monkeypatch, whole_calls)(turns)  # an older file: no cap
    assert sum(whole_calls) == 20 and max(whole_calls) > 8  # chunks as the sampler's cost model cuts them
    assert capped == whole and len(capped) == 20
