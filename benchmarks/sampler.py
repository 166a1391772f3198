"""Generated tokens/s of our sampler against transformers `generate` (PyTorch, CPU), same run.

Setting: random Qwen2 with vocab 8192, hidden 512, intermediate 1408, 4 layers, 8 heads,
2 KV heads, untied (~20M parameters); greedy, EOS disabled so both sides generate exactly `--new`
tokens per row. Two workloads, each timed against `generate` on the same rows:

- plain: batch 32, prompt 256, 64 new tokens (every row its own prompt).
- group: 4 groups x 8 rows (GRPO-style rollouts of one task), each row a 512-token prefix its group
  shares followed by its own 64 tokens, 64 new tokens. Our requests declare their group, so the
  sampler prefills and stores each group's prefix once; `generate` runs the 32 full 576-token rows.
  Our own time on the same rows without groups is printed beside it.

Time is wall time of a whole call (prefill included), best of a few repeats; our compile time is
reported apart. The fraction of the compute limit is the work's FLOPs over our wall time, divided by
the FLOP/s of a large fp32 matmul on this machine (plain workload).

    python benchmarks/sampler.py [--workload plain|group|both] [--repeats 3] [--model DIR]

``--model DIR`` runs both sides on a real Hugging Face Llama / Qwen2 directory instead (the same
weights: transformers loads DIR in float32, we load it with ``load_pretrained``).

Process CPU seconds per call are printed beside the wall times: on a machine shared with other jobs
they show the work each side needs, which the wall-clock ratio alone cannot. Last line: one JSON object
with a record per workload.
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


def build_models(tmp: Path, seed: int = 0, model_dir: str | None = None):
    """transformers' model and the directory our side loads: DIR itself, or random weights saved to tmp."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if model_dir:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    else:
        hf = Qwen2ForCausalLM(Qwen2Config(**BENCH_CONFIG)).eval().float()
        hf.save_pretrained(str(tmp))
    hf.generation_config.eos_token_id = None
    return hf, Path(model_dir or tmp)


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


def timed_ours(run, repeats: int) -> tuple[float, float, float, list]:
    """(best wall, its CPU seconds, compile seconds, first output): the first call compiles, then the
    best of `repeats` calls."""
    first = time.perf_counter()
    out = run()
    first = time.perf_counter() - first
    wall, cpu = best_time(run, repeats)
    return wall, cpu, max(0.0, first - wall), out


def print_rates(*sides: tuple[str, float, float, float, str]) -> None:
    """One aligned line per side: (name, wall s, CPU s, generated tok/s, note)."""
    width = max(len(name) for name, *_ in sides) + 1
    for name, wall, cpu, tps, note in sides:
        print(
            f"  {name + ':':{width}s} {wall:.2f} s wall, {cpu:.2f} s CPU  {tps:8.1f} generated tok/s  ({note})"
        )


def plain_workload(args, sampler_for, params, hf) -> dict:
    from roleagent_jax.sampling import SampleRequest, SamplingParams

    rng = np.random.default_rng(0)
    prompts = rng.integers(1, args.hf_config["vocab_size"], size=(args.batch, args.prompt)).astype(np.int64)
    reqs = [SampleRequest([int(t) for t in row], args.new) for row in prompts]
    sampler = sampler_for(batch_buckets=(args.batch,), prompt_buckets=(args.prompt,))

    def run_ours() -> list:
        return sampler.generate(params, reqs, SamplingParams(greedy=True), jax.random.key(0))

    limit = matmul_flops_per_s()
    ours, ours_cpu, compile_s, out = timed_ours(run_ours, args.repeats)
    assert all(len(o.token_ids) == args.new for o in out)
    torch_s, torch_cpu, torch_threads = time_torch(hf, prompts, args.new, args.repeats)
    ours, ours_cpu = min((ours, ours_cpu), best_time(run_ours, args.repeats))  # interleaved: load drifts
    limit = max(limit, matmul_flops_per_s())
    generated = args.batch * args.new
    flops = generation_flops(args.hf_config, args.batch, args.prompt, args.new)
    ours_tps, torch_tps = generated / ours, generated / torch_s
    print(f"[plain] batch {args.batch}, prompt {args.prompt}, {args.new} new")
    print_rates(
        ("ours", ours, ours_cpu, ours_tps, f"compile {compile_s:.1f} s"),
        ("torch", torch_s, torch_cpu, torch_tps, f"{torch_threads} thread(s)"),
    )
    print(
        f"  work {flops / 1e9:.1f} GFLOP; matmul limit {limit / 1e9:.1f} GFLOP/s = {generated * limit / flops:.0f} tok/s"
    )
    return {
        "tokens_per_s": round(ours_tps, 1),
        "ratio_vs_torch": round(ours_tps / torch_tps, 3),
        "fraction_of_limit": round(flops / ours / limit, 3),
        "torch_tokens_per_s": round(torch_tps, 1),
        "compile_s": round(compile_s, 2),
        "cpu_s_ours": round(ours_cpu, 2),
        "cpu_s_torch": round(torch_cpu, 2),
    }


def group_prompts(groups: int, rows: int, prefix: int, suffix: int, vocab: int, seed: int = 0) -> np.ndarray:
    """``[groups * rows, prefix + suffix]`` ids: rows of a group share their first ``prefix`` tokens and
    differ from the next one on (each row's own part starts with a different token)."""
    rng = np.random.default_rng(seed)
    out = np.empty((groups * rows, prefix + suffix), np.int64)
    for g in range(groups):
        head = rng.integers(1, vocab, size=prefix)
        firsts = rng.choice(np.arange(1, vocab), size=rows, replace=False)
        for r in range(rows):
            out[g * rows + r, :prefix] = head
            out[g * rows + r, prefix:] = np.concatenate(
                [[firsts[r]], rng.integers(1, vocab, size=suffix - 1)]
            )
    return out


def group_workload(args, sampler_for, params, hf) -> dict:
    from roleagent_jax.sampling import SampleRequest, SamplingParams

    groups, rows = args.groups, args.group_size
    prompts = group_prompts(groups, rows, args.prefix, args.suffix, args.hf_config["vocab_size"])
    grouped = [
        SampleRequest([int(t) for t in row], args.new, group=b // rows) for b, row in enumerate(prompts)
    ]
    single = [SampleRequest(r.prompt_ids, r.max_new_tokens) for r in grouped]
    sampler = sampler_for(  # buckets that fit both layouts exactly: no padding on either side
        batch_buckets=(groups * rows,), prompt_buckets=(args.suffix, args.prefix, args.prefix + args.suffix)
    )
    greedy = SamplingParams(greedy=True)

    def run_shared() -> list:
        return sampler.generate(params, grouped, greedy, jax.random.key(0))

    def run_unshared() -> list:
        return sampler.generate(params, single, greedy, jax.random.key(0))

    ours, ours_cpu, compile_s, shared_out = timed_ours(run_shared, args.repeats)
    layout = sampler.last_layout
    assert layout is not None and layout.prefix_len.max() == args.prefix, "the groups were not shared"
    assert [o.token_ids for o in shared_out] == [o.token_ids for o in run_unshared()]  # greedy: identical
    torch_s, torch_cpu, torch_threads = time_torch(hf, prompts, args.new, args.repeats)
    ours, ours_cpu = min((ours, ours_cpu), best_time(run_shared, args.repeats))
    unshared, unshared_cpu = best_time(run_unshared, args.repeats)
    generated = len(grouped) * args.new
    ours_tps, torch_tps, unshared_tps = generated / ours, generated / torch_s, generated / unshared
    print(
        f"[group] {groups} groups x {rows} rows, {args.prefix}-token shared prefix + {args.suffix} own, "
        f"{args.new} new; layout {layout.groups} groups x {layout.rows_per_group} rows, prefix bucket "
        f"{layout.prefix_bucket}, suffix bucket {layout.suffix_bucket}"
    )
    print_rates(
        ("ours", ours, ours_cpu, ours_tps, f"compile {compile_s:.1f} s"),
        ("unshared", unshared, unshared_cpu, unshared_tps, "same rows, no groups"),
        ("torch", torch_s, torch_cpu, torch_tps, f"{torch_threads} thread(s)"),
    )
    return {
        "tokens_per_s": round(ours_tps, 1),
        "ratio_vs_torch": round(ours_tps / torch_tps, 3),
        "torch_tokens_per_s": round(torch_tps, 1),
        "unshared_tokens_per_s": round(unshared_tps, 1),
        "ratio_vs_unshared": round(ours_tps / unshared_tps, 3),
        "compile_s": round(compile_s, 2),
        "cpu_s_ours": round(ours_cpu, 2),
        "cpu_s_unshared": round(unshared_cpu, 2),
        "cpu_s_torch": round(torch_cpu, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("plain", "group", "both"), default="both")
    parser.add_argument("--batch", type=int, default=32, help="plain workload: rows")
    parser.add_argument("--prompt", type=int, default=256, help="plain workload: prompt tokens")
    parser.add_argument("--groups", type=int, default=4, help="group workload: groups")
    parser.add_argument("--group-size", type=int, default=8, help="group workload: rows per group")
    parser.add_argument("--prefix", type=int, default=512, help="group workload: shared prefix tokens")
    parser.add_argument("--suffix", type=int, default=64, help="group workload: each row's own tokens")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--model", default=None, help="a Hugging Face Llama / Qwen2 directory (default: random)"
    )
    args = parser.parse_args()
    args.hf_config = (
        json.loads((Path(args.model) / "config.json").read_text()) if args.model else BENCH_CONFIG
    )

    import torch
    from flax import nnx

    from roleagent_jax.models import load_pretrained
    from roleagent_jax.sampling import Sampler

    print(f"devices: {jax.devices()}  torch threads: {torch.get_num_threads()}  cpus: {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        hf, directory = build_models(Path(tmp), model_dir=args.model)
        model, cfg = load_pretrained(directory)
    graphdef, params = nnx.split(model)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print(f"model: {n_params / 1e6:.1f}M parameters")
    tokenizer = word_tokenizer(cfg.vocab_size)

    def sampler_for(**buckets) -> Sampler:
        return Sampler(graphdef, cfg, tokenizer, eos_ids=(), max_new_tokens_cap=args.new, **buckets)

    record: dict = {"bench": "sampler", "model": args.model or "random"}
    if args.workload in ("plain", "both"):
        record["plain"] = plain_workload(args, sampler_for, params, hf)
    if args.workload in ("group", "both"):
        record["group"] = group_workload(args, sampler_for, params, hf)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
