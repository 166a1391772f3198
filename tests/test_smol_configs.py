"""The SmolLM2 configs resolve and pass start-up checks against the cached checkpoint (no training).

Skips with the reason when ``python -m roleagent_jax.models.smollm2`` has not cached the model.
"""

from pathlib import Path

import pytest
from conftest import load_config as load

from roleagent_jax.config import validate
from roleagent_jax.models import smollm2
from roleagent_jax.models.tokenizer import chat_prompt, load_tokenizer

pytestmark = pytest.mark.skipif(
    smollm2.cached() is None,
    reason="SmolLM2-135M-Instruct is not cached: run python -m roleagent_jax.models.smollm2",
)


@pytest.mark.parametrize(("name", "family"), [("webshop_smol", "webshop"), ("search_qa_smol", "search_qa")])
def test_smol_config_passes_startup_checks(name: str, family: str):
    c = validate(load(name))
    assert c.env.name == family and c.model.required
    assert Path(c.model.path) == smollm2.model_dir()
    assert c.tokenizer.path == ""  # the checkpoint's own tokenizer, not a trained BPE
    assert c.warmstart.end_turn and c.lora.rank > 0


def test_the_checkpoints_chat_template_frames_the_prompt():
    tok = load_tokenizer(smollm2.model_dir())
    text = chat_prompt(tok, "Instruction: buy a lamp")
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
