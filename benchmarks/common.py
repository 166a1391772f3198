"""Shared benchmark helpers: the machine's measured matmul throughput, model FLOPs, JSON output."""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# each family's embedded default: the config the learning benchmark trains and evaluates
DEMO_CONFIGS = {"alfworld": "demo", "webshop": "webshop_demo", "search_qa": "search_qa_demo"}


def demo_config(env: str = "alfworld"):
    """The family's embedded default config (configs/demo.py for ALFWorld)."""
    return importlib.import_module(f"configs.{DEMO_CONFIGS[env]}").get_config()


# The benchmark Qwen2 (about 20M parameters) used by the forward and sampler benchmarks.
BENCH_QWEN2 = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    max_position_embeddings=4096,
)


def matmul_flops_per_s(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a large float32 matmul under XLA on this machine: the compute limit we compare to."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    mm(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * n**3 / min(times)


def _get(config: Any, name: str) -> Any:
    return config[name] if isinstance(config, dict) else getattr(config, name)


def model_flops_per_token(config: Any, seq_len: int, training: bool) -> float:
    """Matmul FLOPs per token: 2 per weight (the embedding lookup is free, the head is not) plus
    attention scores and mixing over the full ``seq_len`` keys; training adds the backward (2x forward)."""
    h, inter = _get(config, "hidden_size"), _get(config, "intermediate_size")
    heads, kv = _get(config, "num_attention_heads"), _get(config, "num_key_value_heads")
    head_dim = _get(config, "head_dim") if _has(config, "head_dim") else h // heads
    layers, vocab = _get(config, "num_hidden_layers"), _get(config, "vocab_size")
    per_layer = h * heads * head_dim * 2 + h * kv * head_dim * 2 + 3 * h * inter
    weights = layers * per_layer + h * vocab
    attention = layers * 2 * 2 * seq_len * heads * head_dim
    forward = 2 * weights + attention
    return float(3 * forward if training else forward)


def _has(config: Any, name: str) -> bool:
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return bool(value)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n); 0 for a single value)."""
    v = np.asarray(values, np.float64)
    return float(v.mean()), (float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0)


def print_json(record: dict) -> None:
    """One JSON object on its own line (the benchmarks' last line is machine-read)."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
