"""Shared helpers for the model tests: tiny random transformers Qwen2 models and padded batches."""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB = 128
# The two tiny Qwen2 shapes the tests build, as config fields that transformers' Qwen2Config and ours
# both take. rope_theta is transformers' default, so a model of ours and a torch one agree.
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
)
ONE_LAYER = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
# Game text for the samplers' tokenizer (`game_tokenizer`).
TEXTS = [
    "You arrive at the kitchen. On the countertop 1, you see an apple 1, a knife 2, and a mug 3.",
    "Your task is to: put a clean apple in fridge. <think>I need the apple first.</think>",
    "<action>take apple 1 from countertop 1</action> You pick up the apple 1 from the countertop 1.",
    "Nothing happens. You open the fridge 1. The fridge 1 is open. In it, you see a lettuce 1.",
]


def tiny_fields(**overrides: Any) -> dict:
    """``TINY``'s fields with ``overrides`` (a test's own sizes, dtypes or options)."""
    return {**TINY, **overrides}


def tiny_config(**overrides: Any):
    """Our Qwen2Config of ``tiny_fields(**overrides)``."""
    from roleagent_jax.models import Qwen2Config

    return Qwen2Config(**tiny_fields(**overrides))


def one_layer_fields(**overrides: Any) -> dict:
    """``ONE_LAYER``'s fields with ``overrides``."""
    return {**ONE_LAYER, **overrides}


def one_layer_config(**overrides: Any):
    """Our Qwen2Config of ``one_layer_fields(**overrides)``."""
    from roleagent_jax.models import Qwen2Config

    return Qwen2Config(**one_layer_fields(**overrides))


def torch_qwen2(tie: bool, kv_heads: int, seed: int = 0, layers: int = 2):
    """A tiny fp32 transformers Qwen2ForCausalLM with every weight (biases, norms too) randomised."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    fields = tiny_fields(
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**fields)).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    return model


def left_padded_batch(seed: int = 0, lengths=(9, 6, 3, 1), total: int = 9):
    """ids, mask (left padding, rows of different lengths) and HF-style positions cumsum(mask)-1."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, (len(lengths), total)).astype(np.int32)
    mask = np.zeros((len(lengths), total), np.int32)
    for row, n in enumerate(lengths):
        mask[row, total - n :] = 1
    ids = np.where(mask == 1, ids, 0).astype(np.int32)
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0).astype(np.int32)
    return ids, mask, positions


def left_padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """ids and mask of token rows left-padded with 0 to the longest, as the sampler lays them out."""
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :], mask[b, width - len(row) :] = row, 1
    return ids, mask


def torch_logits(model, ids, mask, positions) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def max_diff_on_real(a, b, mask) -> float:
    real = np.asarray(mask).astype(bool)
    return float(np.abs(np.asarray(a) - np.asarray(b))[real].max())


def forward(model, ids, mask, positions=None):
    """Jitted full forward (eager op-by-op dispatch is far slower than compiling these tiny models)."""
    from flax import nnx

    graphdef, params = nnx.split(model)
    return _jit_forward(graphdef, params, ids, mask, positions)


def _forward_impl(graphdef, params, ids, mask, positions):
    from flax import nnx

    return nnx.merge(graphdef, params)(ids, mask, positions)


def _make_jit():
    import jax

    return jax.jit(_forward_impl, static_argnums=0)


_jit_forward = _make_jit()


def game_tokenizer():
    """A tiny byte-level BPE trained on ASCII game text (every token decodes to ASCII)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=160, special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.train_from_iterator(TEXTS * 10, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def sampling_qwen2(vocab: int):
    """A tiny fp32 transformers Qwen2 whose weights are large enough that greedy output varies."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    fields = tiny_fields(vocab_size=vocab, max_position_embeddings=512, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(Qwen2Config(**fields)).eval().float()
    with torch.no_grad():  # large enough weights that the output is not one repeated token
        for name, p in model.named_parameters():
            p.copy_(
                1.0 + 0.1 * torch.randn_like(p)
                if name.endswith("norm.weight")
                else 0.15 * torch.randn_like(p)
            )
    return model


def saved_sampling_model(path):
    """`sampling_qwen2` over `game_tokenizer`'s vocabulary, saved at `path` and loaded back as the project
    loads a checkpoint: (tokenizer, module, config, graphdef, params)."""
    from flax import nnx

    from roleagent_jax.models import load_pretrained

    tok = game_tokenizer()
    sampling_qwen2(len(tok)).save_pretrained(str(path))
    module, cfg = load_pretrained(path)
    graphdef, params = nnx.split(module)
    return tok, module, cfg, graphdef, params


def assert_same_results(out, ref, atol: float = 1e-5) -> None:
    """Two lists of `SampleResult`s agree: tokens, finish reasons, text and role exactly, log-probs and
    prompt scores within `atol`."""
    for o, r in zip(out, ref, strict=True):
        assert (o.token_ids, o.finish_reason, o.text, o.role) == (
            r.token_ids,
            r.finish_reason,
            r.text,
            r.role,
        )
        np.testing.assert_allclose(o.logprobs, r.logprobs, atol=atol, rtol=0)
        np.testing.assert_allclose(o.prompt_logprobs, r.prompt_logprobs, atol=atol, rtol=0)


def tiny_sft_model(max_positions: int = 64):
    """(graphdef, params) of a 1-layer random Qwen2 over a 64-token vocabulary, for warm-start tests."""
    from flax import nnx

    from roleagent_jax.models import Qwen2ForCausalLM

    cfg = one_layer_config(max_position_embeddings=max_positions)
    return nnx.split(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)


def char_ids(text: str) -> list[int]:
    """One token per character (ids 1-60), so cutting a text cuts its token list alike."""
    return [1 + (ord(ch) % 60) for ch in text]


class Killed(Exception):
    """What `kill_after` raises in place of a SIGKILL."""


def kill_after(n: int):
    """A `progress` wrapper for `run_sft` that stops the loop before its n-th step, as a kill would."""

    def progress(steps):
        for i, s in enumerate(steps):
            if i == n:
                raise Killed
            yield s

    return progress
