"""Rollout speed of a LoRA policy: adapters applied on the fly in each projection against adapters
merged into a sampling copy of the kernels (once per iteration), same run.

    python benchmarks/lora_sampling.py [--shape demo|smollm2-135m] [--rank 16] [--rows 32] \\
        [--prompt 128] [--new 32] [--repeats 3]

Random model of the shape (``benchmarks/forward.py``'s SHAPES) with rank-R adapters on every
projection (B randomised, so they change the output); greedy, EOS disabled, so every row generates
exactly ``--new`` tokens. Times are the best wall time of a whole sampler call (prefill included)
after a compiling call, with that call's process CPU seconds (on a shared machine they show the work
each variant needs); the merge (a jitted ``lora.merged`` of the whole model) is timed apart, as a
run pays it once per iteration while an iteration makes one sampler call per episode step. Both
variants must produce the same tokens. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.common import print_json  # noqa: E402
from benchmarks.forward import SHAPES  # noqa: E402
from benchmarks.sampler import best_time, word_tokenizer  # noqa: E402
from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora, merged  # noqa: E402
from roleagent_jax.sampling import Sampler, SampleRequest, SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("demo", "smollm2-135m"), default="demo")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    cfg = Qwen2Config.from_hf(dict(SHAPES[args.shape], model_type="qwen2"))
    model = Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0))
    base_def = nnx.graphdef(model)
    add_lora(model, LoRAConfig(rank=args.rank), nnx.Rngs(1))
    graphdef, adapters, base = nnx.split(model, LoRAParam, ...)
    rng = np.random.default_rng(0)
    adapters = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0, 0.02, x.shape), x.dtype) if not x.any() else x, adapters
    )
    tok = word_tokenizer(cfg.vocab_size)
    ids = rng.integers(1, cfg.vocab_size, (args.rows, args.prompt))
    requests = [SampleRequest(list(map(int, row)), args.new) for row in ids]
    greedy = SamplingParams(greedy=True)
    key = jax.random.PRNGKey(0)
    on_the_fly = Sampler(graphdef, cfg, tok, eos_ids=(), max_new_tokens_cap=args.new)
    plain = Sampler(base_def, cfg, tok, eos_ids=(), max_new_tokens_cap=args.new)
    merge = jax.jit(lambda a, b: nnx.state(merged(nnx.merge(graphdef, a, b)), nnx.Param))

    def run_fly():
        return on_the_fly.generate(nnx.merge_state(base, adapters), requests, greedy, key)

    def run_merged():
        return plain.generate(merged_params, requests, greedy, key)

    merged_params = jax.block_until_ready(merge(adapters, base))  # compiles the merge
    merge_s, _ = best_time(lambda: jax.block_until_ready(merge(adapters, base)), args.repeats)
    first_fly, first_merged = run_fly(), run_merged()  # compile
    same = [r.token_ids for r in first_fly] == [r.token_ids for r in first_merged]
    results = {"fly": [], "merged": []}
    for _ in range(args.repeats):  # alternating, so a busy machine slows both alike
        results["fly"].append(best_time(run_fly, 1))
        results["merged"].append(best_time(run_merged, 1))
    (fly_s, fly_cpu), (merged_s, merged_cpu) = min(results["fly"]), min(results["merged"])
    tokens = args.rows * args.new
    print(f"same tokens: {same}")
    print(f"on the fly: {fly_s:.3f} s per call, {fly_cpu:.3f} CPU s ({tokens / fly_s:.1f} new tok/s)")
    print(
        f"merged:     {merged_s:.3f} s per call, {merged_cpu:.3f} CPU s ({tokens / merged_s:.1f} new tok/s)"
        f" + {merge_s:.3f} s merge"
    )
    print_json(
        {
            "bench": "lora_sampling",
            "shape": args.shape,
            "rank": args.rank,
            "rows": args.rows,
            "prompt": args.prompt,
            "new": args.new,
            "same_tokens": same,
            "on_the_fly_call_s": round(fly_s, 4),
            "merged_call_s": round(merged_s, 4),
            "on_the_fly_cpu_s": round(fly_cpu, 4),
            "merged_cpu_s": round(merged_cpu, 4),
            "merge_s": round(merge_s, 4),
        }
    )


if __name__ == "__main__":
    main()
