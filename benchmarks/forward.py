"""Training forward+backward tokens/s of our jitted Qwen2 against transformers' PyTorch Qwen2, same run.

    python benchmarks/forward.py [--batch 8] [--seq 512] [--rounds 3] [--model DIR]

Both sides start from the same weights: random ones (the PyTorch model is saved and loaded with
``load_pretrained``), or a real Hugging Face Llama / Qwen2 directory given by ``--model`` (transformers
loads it in float32, we with ``load_pretrained``). They compute the mean next-token cross-entropy and all gradients, and are timed in
alternating rounds so a busy machine slows both alike. Warm-up and compilation are excluded from the
rates; compilation time is reported separately. Last line: one JSON object.
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
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.common import BENCH_QWEN2, matmul_flops_per_s, model_flops_per_token, print_json  # noqa: E402
from roleagent_jax.models import load_pretrained  # noqa: E402


def jax_step(graphdef):
    """Jitted (params, ids) -> (loss, grads); the weights are an argument, the loss is inside."""

    def loss_fn(params, ids):
        logits = nnx.merge(graphdef, params)(ids)[:, :-1]
        picked = jnp.take_along_axis(logits, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    return jax.jit(jax.value_and_grad(loss_fn))


def torch_step(model, ids):
    def run():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--model", default=None, help="a Hugging Face Llama / Qwen2 directory (default: random)"
    )
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    if args.model:
        torch_model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).train()
        model, cfg = load_pretrained(args.model)
        flops_config = json.loads((Path(args.model) / "config.json").read_text())
    else:
        torch_model = Qwen2ForCausalLM(Qwen2Config(**BENCH_QWEN2)).float().train()
        flops_config = BENCH_QWEN2
        with tempfile.TemporaryDirectory() as tmp:
            torch_model.save_pretrained(tmp)
            model, cfg = load_pretrained(tmp)
    graphdef, params = nnx.split(model)
    ids_np = np.random.RandomState(0).randint(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
    ids = jnp.asarray(ids_np)
    ids_torch = torch.tensor(ids_np, dtype=torch.long)

    step = jax_step(graphdef)
    start = time.perf_counter()
    compiled = step.lower(params, ids).compile()
    compile_s = time.perf_counter() - start

    def run_jax():
        loss, grads = compiled(params, ids)
        jax.block_until_ready(grads)
        return float(loss)

    run_torch = torch_step(torch_model, ids_torch)
    jax_loss, torch_loss = run_jax(), float(run_torch())  # warm-up
    jax_times, torch_times = [], []
    for _ in range(args.rounds):
        for fn, times in ((run_jax, jax_times), (run_torch, torch_times)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    tokens = args.batch * args.seq
    jax_tps = tokens / float(np.median(jax_times))
    torch_tps = tokens / float(np.median(torch_times))
    limit = matmul_flops_per_s()
    flops = model_flops_per_token(flops_config, args.seq, training=True)
    print(f"loss jax={jax_loss:.5f} torch={torch_loss:.5f}")
    print(
        f"jax   {jax_tps:8.1f} tok/s  (step times {[round(t, 3) for t in jax_times]}, compile {compile_s:.1f}s)"
    )
    print(f"torch {torch_tps:8.1f} tok/s  (step times {[round(t, 3) for t in torch_times]})")
    print(
        f"matmul limit {limit / 1e9:.1f} GFLOP/s, {flops / 1e6:.1f} MFLOP/token; torch at {torch_tps * flops / limit:.2f}"
    )
    print_json(
        {
            "bench": "forward",
            "model": args.model or "random",
            "tokens_per_s": round(jax_tps, 1),
            "torch_tokens_per_s": round(torch_tps, 1),
            "ratio_vs_torch": round(jax_tps / torch_tps, 3),
            "fraction_of_limit": round(jax_tps * flops / limit, 3),
            "compile_s": round(compile_s, 2),
            "batch": args.batch,
            "seq": args.seq,
            "devices": jax.device_count(),
        }
    )


if __name__ == "__main__":
    main()
