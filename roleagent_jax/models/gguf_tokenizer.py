"""A Hugging Face fast tokenizer rebuilt from a GGUF file's vocabulary, merges and special tokens.

Only byte-level BPE vocabularies (``tokenizer.ggml.model`` ``gpt2``: Llama-3, Qwen2, SmolLM...) are
supported. The pre-tokenizer is picked by ``tokenizer.ggml.pre``, the name llama.cpp gives the split
rule the merges were learned with; a name we do not know is refused rather than guessed, since a wrong
split silently changes token ids.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from roleagent_jax.models.gguf_import import GGUFError
from roleagent_jax.models.tokenizer import QWEN2_PRETOKENIZE_REGEX

_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _split(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _pre_tokenizer(pre: str) -> tuple[pre_tokenizers.PreTokenizer, normalizers.Normalizer | None]:
    """(pre-tokenizer, normalizer) for llama.cpp's pre-tokenizer name."""
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt2"):
        return gpt2, None
    if pre == "smollm":  # single digits, then GPT-2's split (SmolLM's own tokenizer.json)
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2]), None
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return _split(QWEN2_PRETOKENIZE_REGEX), normalizers.NFC()
    if pre in ("llama3", "llama-v3", "llama-bpe"):
        return _split(_LLAMA3_REGEX), None
    raise ValueError(f"pre-tokenizer {pre!r} is not supported (smollm, qwen2, llama-bpe, gpt2/default)")


def _token(meta: dict[str, Any], key: str) -> str | None:
    index = meta.get(f"tokenizer.ggml.{key}")
    tokens = meta["tokenizer.ggml.tokens"]
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def build_tokenizer(meta: dict[str, Any], path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """The file's tokenizer as a fast tokenizer carrying its special tokens and chat template.

    Raises GGUFError naming ``path`` when the file's tokenizer is absent or of an unsupported kind.
    """
    path = Path(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{path}: tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or not merges:
        raise GGUFError(f"{path}: tokenizer.ggml.tokens or tokenizer.ggml.merges is missing")
    try:
        pre, norm = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    except ValueError as err:
        raise GGUFError(f"{path}: {err}") from None
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=False))
    bpe.pre_tokenizer = pre
    if norm is not None:
        bpe.normalizer = norm
    bpe.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    bpe.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    bpe.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    bos = _token(meta, "bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    else:
        bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=bos,
        eos_token=_token(meta, "eos_token_id"),
        unk_token=_token(meta, "unknown_token_id"),
        pad_token=_token(meta, "padding_token_id"),
        clean_up_tokenization_spaces=False,
    )
    template = meta.get("tokenizer.chat_template")
    if template:
        tok.chat_template = template
    return tok
