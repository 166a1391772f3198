"""Generated tokens/s of our sampler against transformers `generate` (PyTorch, CPU), same run.

Setting (issue 3): random Qwen2 with vocab 8192, hidden 512, intermediate 1408, 4 layers, 8 heads,
2 KV heads, untied (~20M parameters); batch 32, prompt 256, 64 new tokens, greedy, EOS disabled so
both sides generate exactly 64 tokens per row. Time is wall time of a whole call (prefill included),
best of a few repeats; our compile time is reported apart. The fraction of the compute limit is the
work's FLOPs over our wall time, divided by the FLOP/s of a large fp32 matmul on this machine.

    python benchmarks/sampler.py [--batch 32 --prompt 256 --new 64 --repeats 3]

Process CPU seconds per call are printed beside the wall times: on a machine shared with other jobs
they show the work each side needs, which the wall-clock ratio alone cannot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import BENCH_QWEN2 as BENCH_CONFIG  # noqa: E402
from benchmarks.common import matmul_flops_per_s  # noqa: E402


def generation_flops(cfg: dict, batch: int, prompt: int, new: int) -> float:
    """Matmul FLOPs of prefill plus decode: 2*params per processed token for the blocks (embedding
    lookups are free), the vocabulary projection only where logits are used (last prompt position and
    every generated step), and attention scores+values against the visible context."""
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // heads
    block = 2 * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i)
    tokens_in = prompt + new - 1  # the last generated token is never fed back
    ctx = sum(range(1, prompt + new))  # visible keys summed over processed positions
    attention = 4 * heads * d * ctx * layers
    head = 2 * h * cfg["vocab_size"] * new
    return float(batch * (layers * block * tokens_in + attention + head))


def build_models(tmp: Path, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    hf = Qwen2ForCausalLM(Qwen2Config(**BENCH_CONFIG)).eval().float()
    hf.generation_config.eos_token_id = None
    hf.save_pretrained(str(tmp))
    return hf


def word_tokenizer(vocab: int):
    """A word-level tokenizer with one made-up word per id: enough for the sampler to decode text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0")


def best_time(fn, repeats: int) -> tuple[float, float]:
    """Best (wall seconds, process CPU seconds) over `repeats` calls, ranked by wall time."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def time_torch(hf, prompts: np.ndarray, new: int, repeats: int) -> tuple[float, float, int]:
    """Best (wall, CPU) of `generate` and the thread count that gave it. PyTorch's default (one thread
    per core) is tried and so is one thread: on a machine shared with other jobs, OpenMP threads that
    wait on each other can make the default many times slower, which would flatter our ratio."""
    import torch

    ids = torch.tensor(prompts, dtype=torch.long)
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    default_threads = torch.get_num_threads()
    best = (float("inf"), float("inf"), default_threads)
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, **kwargs)
        assert out.shape[1] == prompts.shape[1] + new
        for threads in sorted({default_threads, 1}, reverse=True):
            torch.set_num_threads(threads)
            wall, cpu = best_time(lambda: hf.generate(input_ids=ids, attention_mask=mask, **kwargs), repeats)
            best = min(best, (wall, cpu, threads))
    torch.set_num_threads(default_threads)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    from flax import nnx

    from roleagent_jax.models import load_pretrained
    from roleagent_jax.sampling import Sampler, SampleRequest, SamplingParams

    print(f"devices: {jax.devices()}  torch threads: {torch.get_num_threads()}  cpus: {os.cpu_count()}")
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, BENCH_CONFIG["vocab_size"], size=(args.batch, args.prompt)).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_models(Path(tmp))
        model, cfg = load_pretrained(tmp)
    graphdef, params = nnx.split(model)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print(f"model: {n_params / 1e6:.1f}M parameters")

    tokenizer = word_tokenizer(cfg.vocab_size)
    reqs = [SampleRequest([int(t) for t in row], args.new) for row in prompts]
    greedy = SamplingParams(greedy=True)

    sampler = Sampler(
        graphdef, cfg, tokenizer, eos_ids=(), batch_buckets=(args.batch,), prompt_buckets=(args.prompt,),
        max_new_tokens_cap=args.new,
    )  # fmt: skip

    def run_ours() -> list:
        return sampler.generate(params, reqs, greedy, jax.random.key(0))

    first = time.perf_counter()
    out = run_ours()
    first = time.perf_counter() - first
    assert all(len(o.token_ids) == args.new for o in out)
    limit = matmul_flops_per_s()
    ours, ours_cpu = best_time(run_ours, args.repeats)
    compile_s = max(0.0, first - ours)
    torch_s, torch_cpu, torch_threads = time_torch(hf, prompts, args.new, args.repeats)
    ours, ours_cpu = min((ours, ours_cpu), best_time(run_ours, args.repeats))  # interleaved: load drifts
    limit = max(limit, matmul_flops_per_s())

    generated = args.batch * args.new
    flops = generation_flops(BENCH_CONFIG, args.batch, args.prompt, args.new)
    ours_tps, torch_tps = generated / ours, generated / torch_s
    fraction = flops / ours / limit
    print(
        f"ours:  {ours:.2f} s wall, {ours_cpu:.2f} s CPU  {ours_tps:8.1f} generated tok/s  (compile {compile_s:.1f} s)"
    )
    print(
        f"torch: {torch_s:.2f} s wall, {torch_cpu:.2f} s CPU  {torch_tps:8.1f} generated tok/s  ({torch_threads} thread(s))"
    )
    print(
        f"work {flops / 1e9:.1f} GFLOP; matmul limit {limit / 1e9:.1f} GFLOP/s = {generated * limit / flops:.0f} tok/s"
    )
    print(
        json.dumps(
            {
                "bench": "sampler",
                "tokens_per_s": round(ours_tps, 1),
                "ratio_vs_torch": round(ours_tps / torch_tps, 3),
                "fraction_of_limit": round(fraction, 3),
                "torch_tokens_per_s": round(torch_tps, 1),
                "compile_s": round(compile_s, 2),
                "cpu_s_ours": round(ours_cpu, 2),
                "cpu_s_torch": round(torch_cpu, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
