"""Tokenizers: load Hugging Face ones, apply chat templates, and train the demo's tiny BPE.

The demo's tiny model needs a vocabulary fitted to game text so that short contexts hold a whole
ALFWorld prompt; real runs use the checkpoint's own tokenizer (Qwen2.5's tokenizer.json).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# ChatML, as Qwen2.5 uses it; the tiny tokenizer ships the same template so prompts look alike.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


# The JSON files transformers reads from a tokenizer directory (each optional).
TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def check_tokenizer_dir(path: str | os.PathLike) -> None:
    """Raise FileNotFoundError / ValueError naming the file when a tokenizer directory is missing, holds
    no tokenizer, has tokenizer.json without tokenizer_config.json (no end-of-turn token, no chat
    template), or has a file that is not valid JSON or not a valid tokenizer.json; cheap enough to run
    at start-up."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    files = {p.name for p in path.iterdir()}
    if not files & {"tokenizer.json", "tokenizer.model", "vocab.json"}:
        raise FileNotFoundError(
            f"no tokenizer in {path}: expected tokenizer.json, tokenizer.model (sentencepiece) or vocab.json"
        )
    if "tokenizer.json" in files and "tokenizer_config.json" not in files:
        raise FileNotFoundError(
            f"{path / 'tokenizer_config.json'} is missing beside tokenizer.json: without it the tokenizer has "
            "no end-of-turn token and no chat template (copy the model's tokenizer_config.json there)"
        )
    for name in TOKENIZER_JSON_FILES:
        if name in files:
            try:
                json.loads((path / name).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as err:
                raise ValueError(f"{path / name}: not valid JSON ({_one_line(err)})") from err
    if "tokenizer.json" in files:
        try:
            Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as err:  # the Rust library raises its own exception type
            raise ValueError(f"{path / 'tokenizer.json'}: not a valid tokenizer ({_one_line(err)})") from err


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load a local tokenizer (tokenizer.json or sentencepiece); never downloads, never runs remote code.
    A broken directory raises naming the file (see `check_tokenizer_dir`)."""
    path = Path(path)
    check_tokenizer_dir(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ValueError(f"tokenizer in {path} could not be loaded: {_one_line(err)}") from err
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def chat_prompt(tokenizer: PreTrainedTokenizerBase, user: str, system: str | None = None) -> str:
    """Render one user turn (and optional system turn) as a generation prompt with the chat template."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


class PromptEncoder:
    """The one way a user message becomes prompt ids: chat-templated, encoded without added special
    tokens (the template placed them), and, with `max_tokens`, cut to its last `max_tokens` ids (the
    end of a prompt holds the current observation and the answer format). Counts the prompts it cut."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_tokens: int | None = None):
        self.tokenizer, self.max_tokens, self.truncated = tokenizer, max_tokens, 0

    def __call__(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(chat_prompt(self.tokenizer, text), add_special_tokens=False)
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            self.truncated += 1
            ids = ids[-self.max_tokens :]
        return ids


def eos_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end a response: the tokenizer's EOS and ChatML's end-of-turn when present."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and save it in Hugging Face format (tokenizer.json + config).

    Byte-level means any text round-trips, so model output is always decodable.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if vocab_size < 300:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE (needs > 256 + specials)"
        )
    bpe = Tokenizer(models.BPE())
    # Qwen2's own pipeline: `transformers` rebuilds exactly this for any directory whose config.json says
    # model_type "qwen2", so training with it keeps encodings identical however the tokenizer is loaded.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok
