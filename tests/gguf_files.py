"""Small GGUF files written with ggml's own writer, for the import tests.

A tiny Llama (or Qwen2) whose tensors cover every supported tensor type, with a byte-level BPE
vocabulary, special tokens and a chat template, as llama.cpp's converter would lay them out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# K-quant block bytes (256 weights) and the offsets of their float16 scale fields.
_K_BLOCKS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2))}
_K_BLOCKS["Q6_K"] = (210, (208,))
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 2
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a", "o u", "Ġ y", "Ġy ou", "e r", "Ġ Ġ", "ĠĠ ĠĠ")


def _byte_alphabet() -> list[str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return chars


def vocabulary() -> tuple[list[str], list[int]]:
    """Tokens and llama.cpp token types (3 = control) of the tiny vocabulary."""
    tokens = list(SPECIALS) + _byte_alphabet()
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def _k_quant(rows: int, cols: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant with small, finite float16 scales (the quantizer exists only in C)."""
    size, scale_offsets = _K_BLOCKS[kind]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    for off in scale_offsets:
        scales = rng.uniform(0.001, 0.01, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off : off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _encode(w: np.ndarray, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[kind]
    if kind == "F32":
        return w.astype(np.float32), None
    if kind == "F16":
        return w.astype(np.float16), None
    if kind in _K_BLOCKS:
        return _k_quant(*w.shape, kind, rng), qtype
    return quants.quantize(w.astype(np.float32), qtype), qtype


def write_tiny(
    path: Path,
    arch: str = "llama",
    pre: str = "smollm",
    seed: int = 0,
    types: tuple[str, ...] = TYPES,
    tied: bool = False,
    declared: dict | None = None,
) -> Path:
    """A tiny model GGUF; the i-th matrix (embedding first) is stored as ``types[i % len(types)]``.
    `declared` overrides header values (block_count, vocab_size, embedding_length) whatever the tensors
    hold, as a hostile file would."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, token_types = vocabulary()
    head_dim = HIDDEN // HEADS
    w = gguf.GGUFWriter(str(path), arch)
    header = {
        "block_count": LAYERS,
        "vocab_size": len(tokens),
        "embedding_length": HIDDEN,
        **(declared or {}),
    }
    w.add_block_count(header["block_count"])
    w.add_context_length(512)
    w.add_embedding_length(header["embedding_length"])
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(header["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    matrices = [("token_embd.weight", (len(tokens), HIDDEN))]
    for i in range(LAYERS):
        matrices += [
            (f"blk.{i}.attn_q.weight", (HEADS * head_dim, HIDDEN)),
            (f"blk.{i}.attn_k.weight", (KV_HEADS * head_dim, HIDDEN)),
            (f"blk.{i}.attn_v.weight", (KV_HEADS * head_dim, HIDDEN)),
            (f"blk.{i}.attn_output.weight", (HIDDEN, HEADS * head_dim)),
            (f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN)),
            (f"blk.{i}.ffn_up.weight", (FFN, HIDDEN)),
            (f"blk.{i}.ffn_down.weight", (HIDDEN, FFN)),
        ]
    if not tied:
        matrices.append(("output.weight", (len(tokens), HIDDEN)))
    for k, (name, shape) in enumerate(matrices):
        weight = rng.normal(0.0, 0.08, size=shape).astype(np.float32)
        data, qtype = _encode(weight, types[k % len(types)], rng)
        w.add_tensor(name, data, raw_dtype=qtype)
    vectors = [("output_norm.weight", HIDDEN)]
    for i in range(LAYERS):
        vectors += [(f"blk.{i}.attn_norm.weight", HIDDEN), (f"blk.{i}.ffn_norm.weight", HIDDEN)]
        if arch == "qwen2":
            vectors += [
                (f"blk.{i}.attn_q.bias", HEADS * head_dim),
                (f"blk.{i}.attn_k.bias", KV_HEADS * head_dim),
                (f"blk.{i}.attn_v.bias", KV_HEADS * head_dim),
            ]
    for name, n in vectors:
        value = 1.0 + 0.1 * rng.normal(size=n) if "norm" in name else 0.1 * rng.normal(size=n)
        w.add_tensor(name, value.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
