"""Training forward+backward tokens/s of our jitted Qwen2 against transformers' PyTorch Qwen2, same run.

    python benchmarks/forward.py [--batch 8] [--seq 512] [--rounds 3] [--model DIR]
    python benchmarks/forward.py --lora-rank 16 [--shape demo|smollm2-135m|bench] [--batch 8] [--seq 512]
    python benchmarks/forward.py --update --lora-rank 16 [--shape smollm2-135m] [--batch 4] [--prompt 220] [--response 30]

Both sides start from the same weights: random ones (the PyTorch model is saved and loaded with
``load_pretrained``), or a real Hugging Face Llama / Qwen2 directory given by ``--model`` (transformers
loads it in float32, we with ``load_pretrained``). They compute the mean next-token cross-entropy and all gradients, and are timed in
alternating rounds so a busy machine slows both alike. Warm-up and compilation are excluded from the
rates; compilation time is reported separately. Last line: one JSON object.

``--lora-rank R`` times the project's own PPO train step (``rl.train_step.make_train_step``: loss, grads,
AdamW update, donated state) with rank-R adapters on every projection against full fine-tuning of the
same random model, alternating rounds as above.

``--update`` times that LoRA step on the trainer's own grid (``pack_rows`` of rows with ~``--prompt``-token
prompts and ~``--response``-token responses): today's step (the LM head at every position, adapters on
every layer) against the head at the response tokens only (``target_index``), alone and with adapters
on the top ``--top`` layers only (``lora.layers``). Rates count real tokens; the paired speed-ups are
the median over rounds of each round's own ratio (a machine whose load drifts between rounds skews the
ratio of medians).

    python benchmarks/forward.py --update --shape smollm2-135m --lora-rank 16 --batch 4
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
from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM, load_pretrained  # noqa: E402
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora  # noqa: E402
from roleagent_jax.rl.logprobs import TARGET_KEY  # noqa: E402
from roleagent_jax.rl.optimizer import TrainState, make_optimizer  # noqa: E402
from roleagent_jax.rl.ppo import pack_rows  # noqa: E402
from roleagent_jax.rl.train_step import make_train_step  # noqa: E402

# Model shapes of the LoRA comparison: the demo's random-init model (configs/demo.py, its ~1024-token
# trained tokenizer) and SmolLM2-135M's architecture (random weights: only speed is measured).
SHAPES = {
    "bench": BENCH_QWEN2,
    "demo": dict(
        vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0,
    ),
    "smollm2-135m": dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, attention_bias=False,
        rope_theta=100000.0,
    ),
}  # fmt: skip


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


def ppo_batch(vocab: int, rows: int, seq: int) -> dict[str, jax.Array]:
    """A full grid of random tokens, every token after the first half a response token."""
    rng = np.random.RandomState(0)
    grid = {
        "input_ids": jnp.asarray(rng.randint(0, vocab, (rows, seq)), jnp.int32),
        "attention_mask": jnp.ones((rows, seq), jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (rows, seq)),
        "loss_mask": jnp.asarray(np.arange(seq)[None].repeat(rows, 0) >= seq // 2, jnp.float32),
        "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
    }
    grid["old_logprobs"] = grid["ref_logprobs"] = jnp.full((rows, seq), -np.log(vocab), jnp.float32)
    return grid


def lora_main(args) -> None:
    """Train-step tokens/s with rank-``args.lora_rank`` adapters against full fine-tuning."""
    cfg = Qwen2Config.from_hf(dict(SHAPES[args.shape], model_type="qwen2"))
    batch = ppo_batch(cfg.vocab_size, args.batch, args.seq)
    optimizer = make_optimizer(1e-5)
    loss = {"kl_type": "low_var_kl", "kl_coef": 0.01}
    runs = {}
    for name, rank in (("full", 0), ("lora", args.lora_rank)):
        model = add_lora(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=rank), nnx.Rngs(1))
        graphdef, params, *frozen = nnx.split(model, LoRAParam, ...) if rank else nnx.split(model)
        base = frozen[0] if frozen else None
        step = make_train_step(graphdef, optimizer, loss)
        state = TrainState.create(params, optimizer, jax.random.PRNGKey(0))
        start = time.perf_counter()
        state, _ = step(state, batch, base)  # compiles, then warms up
        jax.block_until_ready(state)
        runs[name] = {"step": step, "state": state, "base": base, "compile_s": time.perf_counter() - start}
        runs[name]["trained"] = sum(x.size for x in jax.tree.leaves(params))
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run["state"], metrics = run["step"](run["state"], batch, run["base"])
            jax.block_until_ready((run["state"], metrics))
            times[name].append(time.perf_counter() - t0)
    tokens = args.batch * args.seq
    rates = {name: tokens / float(np.median(t)) for name, t in times.items()}
    for name, run in runs.items():
        print(
            f"{name:4s} {rates[name]:8.1f} tok/s  ({run['trained'] / 1e6:.2f}M trained params, step times "
            f"{[round(t, 3) for t in times[name]]}, compile+first step {run['compile_s']:.1f}s)"
        )
    print_json(
        {
            "bench": "forward_lora",
            "shape": args.shape,
            "lora_rank": args.lora_rank,
            "lora_tokens_per_s": round(rates["lora"], 1),
            "full_tokens_per_s": round(rates["full"], 1),
            "speedup": round(rates["lora"] / rates["full"], 3),
            "batch": args.batch,
            "seq": args.seq,
            "devices": jax.device_count(),
        }
    )


def update_batch(vocab: int, rows: int, prompt: int, response: int) -> dict[str, jax.Array]:
    """The trainer's grid (``pack_rows``, its default length bucket) of random rows whose prompts are
    within 10% of ``prompt`` tokens and responses within 20% of ``response``."""
    rng = np.random.RandomState(0)

    def around(n: int, spread: float) -> int:
        return int(rng.randint(max(1, round(n * (1 - spread))), round(n * (1 + spread)) + 1))

    prompts = [rng.randint(1, vocab, around(prompt, 0.1)) for _ in range(rows)]
    responses = [rng.randint(1, vocab, around(response, 0.2)) for _ in range(rows)]
    grid = {k: jnp.asarray(v) for k, v in pack_rows(prompts, responses, 0).items()}
    grid["advantages"] = jnp.asarray(rng.normal(size=rows), jnp.float32)
    grid["old_logprobs"] = grid["ref_logprobs"] = jnp.full(
        grid["loss_mask"].shape, -np.log(vocab), jnp.float32
    )
    return grid


def update_main(args) -> None:
    """Today's LoRA step against the head at the response tokens, alone and with adapters on the top
    layers only; one model's base shared by every variant, rounds alternating."""
    cfg = Qwen2Config.from_hf(dict(SHAPES[args.shape], model_type="qwen2"))
    batch = update_batch(cfg.vocab_size, args.batch, args.prompt, args.response)
    whole = {k: v for k, v in batch.items() if k != TARGET_KEY}
    optimizer = make_optimizer(1e-5)
    loss = {"kl_type": "low_var_kl", "kl_coef": 0.01}
    plain_def, base_state = nnx.split(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    variants = [("today", 0, whole), ("targets", 0, batch)]
    variants += [(f"targets_top{k}", k, batch) for k in args.top if k < cfg.num_hidden_layers]
    runs = {}
    for name, layers, grid in variants:
        model = nnx.merge(plain_def, base_state)  # the same base arrays, fresh adapters
        add_lora(model, LoRAConfig(rank=args.lora_rank, layers=layers), nnx.Rngs(1))
        graphdef, params, base = nnx.split(model, LoRAParam, ...)
        step = make_train_step(graphdef, optimizer, loss)
        state = TrainState.create(params, optimizer, jax.random.PRNGKey(0))
        start = time.perf_counter()
        state, _ = step(state, grid, base)  # compiles, then warms up
        jax.block_until_ready(state)
        runs[name] = {"step": step, "state": state, "base": base, "grid": grid, "layers": layers}
        runs[name]["compile_s"] = time.perf_counter() - start
        print(f"{name}: compiled and warmed up in {runs[name]['compile_s']:.1f}s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in runs}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run["state"], metrics = run["step"](run["state"], run["grid"], run["base"])
            jax.block_until_ready((run["state"], metrics))
            times[name].append(time.perf_counter() - t0)
            phases[name].append(dict(run["step"].times))
    tokens = int(np.asarray(batch["attention_mask"]).sum())
    rates = {name: tokens / float(np.median(t)) for name, t in times.items()}
    for name in runs:
        opt = np.median([p["optimizer"] for p in phases[name]])
        print(
            f"{name:16s} {rates[name]:8.1f} tok/s  x{rates[name] / rates['today']:.2f}  (step times "
            f"{[round(t, 2) for t in times[name]]}, optimizer {opt:.3f}s, compile {runs[name]['compile_s']:.0f}s)"
        )
    print_json(
        {
            "bench": "forward_update",
            "shape": args.shape,
            "lora_rank": args.lora_rank,
            "tokens_per_s": {name: round(r, 1) for name, r in rates.items()},
            "speedup_vs_today": {name: round(r / rates["today"], 3) for name, r in rates.items()},
            # Each round's own ratio, then their median: robust to a load that drifts between rounds.
            "paired_speedup_vs_today": {
                name: round(float(np.median(np.divide(times["today"], t))), 3) for name, t in times.items()
            },
            "rows": args.batch,
            "grid": list(batch["input_ids"].shape),
            "targets": int(batch[TARGET_KEY].shape[1]),
            "real_tokens": tokens,
            "response_tokens": int(np.asarray(batch["loss_mask"]).sum()),
            "rounds": args.rounds,
            "devices": jax.device_count(),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--model", default=None, help="a Hugging Face Llama / Qwen2 directory (default: random)"
    )
    parser.add_argument("--lora-rank", type=int, default=0, help="> 0: LoRA against full fine-tuning")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="bench", help="model of --lora-rank")
    parser.add_argument("--update", action="store_true", help="head at targets and top-k adapters")
    parser.add_argument("--prompt", type=int, default=220, help="--update: prompt tokens per row (about)")
    parser.add_argument("--response", type=int, default=30, help="--update: response tokens per row (about)")
    parser.add_argument("--top", type=int, nargs="+", default=[4, 8, 15], help="--update: adapted top layers")
    args = parser.parse_args()
    if args.lora_rank < 0:
        parser.error(f"--lora-rank={args.lora_rank}: must be >= 0")
    if args.update:
        if not args.lora_rank:
            parser.error("--update times LoRA steps: give --lora-rank R (> 0)")
        update_main(args)
        return
    if args.lora_rank:
        lora_main(args)
        return

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
