"""Tokenizer training, saving, reloading through AutoTokenizer, and the chat template."""

import pytest

from roleagent_jax.models.tokenizer import (
    PromptEncoder,
    chat_prompt,
    eos_ids,
    load_tokenizer,
    train_bpe_tokenizer,
)

TEXTS = [
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, and a knife 2.",
    "Your task is to: put a clean apple in fridge.",
    "<think>I need the apple first.</think><action>take apple 1 from countertop 1</action>",
] * 20


def test_train_save_reload_roundtrip(tmp_path):
    tok = train_bpe_tokenizer(TEXTS, vocab_size=400, out_dir=tmp_path)
    reloaded = load_tokenizer(tmp_path)
    assert reloaded.get_vocab() == tok.get_vocab()
    text = "You arrive at fridge 1. Ünïcode ✓ <action>go to sinkbasin 1</action>"
    ids = reloaded.encode(text, add_special_tokens=False)
    assert reloaded.decode(ids) == text  # byte-level: any text round-trips
    assert max(ids) < len(reloaded)


def test_chat_template_and_eos(tmp_path):
    tok = load_tokenizer(train_bpe_tokenizer(TEXTS, 400, tmp_path) and tmp_path)
    prompt = chat_prompt(tok, "Your task is to: put a clean apple in fridge.", system="You are an agent.")
    assert prompt.startswith("<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = PromptEncoder(tok)("Your task is to: put a clean apple in fridge.")
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids  # specials are single tokens
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    cut = PromptEncoder(tok, max_tokens=5)
    assert cut("Your task is to: put a clean apple in fridge.") == ids[-5:] and cut.truncated == 1
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos_ids(tok)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="too small"):
        train_bpe_tokenizer(TEXTS, 100, tmp_path / "t")


def test_encoding_survives_a_qwen2_model_directory(tmp_path):
    """A directory with a qwen2 config.json makes transformers load Qwen2's tokenizer class, which rebuilds
    the pre-tokenizer; our trained tokenizer must encode the same either way."""
    import json

    tok = train_bpe_tokenizer(TEXTS, 400, tmp_path / "tok")
    tok.save_pretrained(str(tmp_path / "model"))
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    plain, as_qwen = load_tokenizer(tmp_path / "tok"), load_tokenizer(tmp_path / "model")
    text = "You arrive at armchair 1. On the armchair 1, you see a cellphone 1.\n<action>go to drawer 12</action>"
    assert plain.encode(text) == as_qwen.encode(text) == tok.encode(text)
