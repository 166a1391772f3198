"""WIA's extra wall time per iteration: `roleagent` (WIA on, AIW off) against `gigpo`, same settings, same run.

    python benchmarks/overhead.py [--regime demo|paper] [--iterations 6] [--aiw] [--model runs/demo/hf_warmstart]
                                  [--unshared]

Both runs start from the same warm-started demo model (the demo's `hf_warmstart` when it exists, so the
predictor writes realistic predictions; otherwise a short warm start each) and take turns, one
iteration each, so a machine whose speed drifts during the benchmark slows both alike; the first
iteration (compilation) is excluded.

`--regime=demo` is the demo's own shape: 10-token actions, predictions up to `wia.max_tokens`.
`--regime=paper` shapes the agent's responses like the paper's: every agent row first decodes
`--reasoning-tokens` of reasoning (the end-of-text token is banned and no stop string applies, so the
tiny model cannot end it early), in the same sampler call as the step's predictor rows; the action then
comes from a short agent-only call on the step's prompt, and the row trains on reasoning + action.
Predictions keep the shape of observations (up to 128 tokens). Its default size runs in minutes on two
CPU cores; `--tasks`, `--group-size`, `--max-steps` and `--reasoning-tokens 512` scale it up.

Iterations in which the sampler compiled a new program (a new bucket shape) are slower by the compile
time, which a long run pays once: the steady overhead compares only the iterations that compiled
nothing. Besides seconds, the JSON reports per iteration the decoded row-tokens (generated tokens summed over
rows) and the prefilled prompt tokens (a sharing group's common prefix counted once): what a
memory-bound accelerator pays, where extra rows in a decode step cost little; on a CPU every row costs
compute. The paper reports 5.2% for WIA + AIW together.

`--unshared` also times `roleagent` the way generation worked before shared prefixes: every row
prefills and attends over its own prompt, and predictor rows are decoded to the end within their
step's call, at the full `wia.max_tokens` budget (no background rows, no cap from the observations
seen). Its generation seconds against the shared run's are what sharing saves. Last line: one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import ROOT, demo_config  # noqa: E402
from roleagent_jax.config import CONFIG  # noqa: E402


def base_config(workdir: Path, iterations: int, model: str):
    c = demo_config()
    if model:
        c.model.path = model
        c.model.init.update(CONFIG.build().model.init)  # the demo's random-model sizes do not apply
        c.warmstart.steps = 0
    else:
        c.warmstart.steps = 100
    c.workdir = str(workdir)
    c.iterations = iterations
    c.env.eval_splits = ()
    c.log.progress = False
    c.log.tensorboard = False
    c.checkpoint.every = 0
    return c


def prefilled_tokens(requests) -> int:
    """Prompt tokens a call prefills when each sharing group's common prefix is prefilled once."""
    from roleagent_jax.sampling.prefix import sharing_groups

    keys = [None if r.group is None else (r.role, r.group) for r in requests]
    groups, _ = sharing_groups([r.prompt_ids for r in requests], keys)
    return sum(len(r.prompt_ids) for r in requests) - sum(share * (len(idx) - 1) for idx, share in groups)


class CountedSampler:
    """Stands in for `Sampler.generate`: counts what each call decodes and prefills and, with
    `reasoning` > 0, forces every agent row to decode that many reasoning tokens first (see above)."""

    def __init__(self, sampler, reasoning: int, unshared_budget: int = 0):
        self.sampler, self.generate, self.reasoning = sampler, sampler.generate, reasoning
        self.unshared_budget = unshared_budget  # > 0: strip sharing, predictor rows at this budget
        self.counts = {"decoded_row_tokens": 0, "prefilled_tokens": 0, "decode_steps": 0, "calls": 0,
                       "compilations": 0}  # fmt: skip

    def _call(self, params, requests, sampling, rng):
        compiled = self.sampler.num_compilations
        out = self.generate(params, requests, sampling, rng)
        self.counts["compilations"] += self.sampler.num_compilations - compiled
        self.counts["decoded_row_tokens"] += sum(len(r.token_ids) for r in out)
        ran = [r for r, o in zip(requests, out, strict=True) if o.token_ids or o.finish_reason != "paused"]
        self.counts["prefilled_tokens"] += prefilled_tokens(ran)  # background rows left out prefill nothing
        self.counts["decode_steps"] += max((len(r.token_ids) for r in out), default=0)
        self.counts["calls"] += 1
        return out

    def __call__(self, params, requests, sampling, rng):
        if self.unshared_budget:
            requests = [
                replace(r, group=None, background=False, max_new_tokens=self.unshared_budget)
                if r.role == "predictor"
                else replace(r, group=None)
                for r in requests
            ]
        agent = [i for i, r in enumerate(requests) if r.role == "agent"]
        if not self.reasoning or not agent:
            return self._call(params, requests, sampling, rng)
        import jax

        from roleagent_jax.sampling import SampleResult

        first = [
            replace(r, max_new_tokens=self.reasoning, stop=()) if r.role == "agent" else r for r in requests
        ]
        eos, self.sampler.eos_ids = self.sampler.eos_ids, ()
        try:
            out = self._call(params, first, sampling, rng)
        finally:
            self.sampler.eos_ids = eos
        budget = [
            replace(requests[i], max_new_tokens=requests[i].max_new_tokens - self.reasoning) for i in agent
        ]
        actions = self._call(params, budget, sampling, jax.random.fold_in(rng, 1))
        for i, act in zip(agent, actions, strict=True):
            thought = out[i]
            out[i] = SampleResult(
                thought.token_ids + act.token_ids, thought.logprobs + act.logprobs, act.text,
                act.finish_reason, act.role,
            )  # fmt: skip
        return out


def time_interleaved(configs: dict, reasoning: int) -> dict[str, dict[str, list[float]]]:
    """Per run and iteration: wall seconds, generation seconds, and the sampler's counts.

    The runs take turns, one iteration each, so a machine that slows down or speeds up during the
    benchmark (other jobs, thermal limits) moves every run alike and their ratio stays fair."""
    from roleagent_jax.run.trainer import Trainer

    runs = {}
    try:
        for name, (config, unshared) in configs.items():
            trainer = Trainer(config)
            sampler = trainer.backend.sampler
            counted = CountedSampler(sampler, reasoning, config.wia.max_tokens if unshared else 0)
            sampler.generate = counted
            runs[name] = (trainer, counted, {"seconds": [], "generate_seconds": []})
            trainer.warm_start()
        iterations = min(config.iterations for config, _ in configs.values())
        for it in range(iterations):
            for trainer, counted, out in runs.values():
                before = dict(counted.counts)
                start = time.perf_counter()
                metrics = trainer.iteration(it)
                out["seconds"].append(time.perf_counter() - start)
                out["generate_seconds"].append(float(metrics.get("time/generate", float("nan"))))
                for k, v in counted.counts.items():
                    out.setdefault(k, []).append(float(v - before[k]))
    finally:
        for trainer, _, _ in runs.values():
            trainer.close()
    return {name: out for name, (_, _, out) in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--aiw", action="store_true", help="also turn AIW on for the roleagent run")
    parser.add_argument("--regime", choices=("demo", "paper"), default="demo")
    parser.add_argument(
        "--reasoning-tokens", type=int, default=128, help="paper regime: reasoning per agent row"
    )
    parser.add_argument("--tasks", type=int, default=0, help="tasks per iteration (0: demo config, paper 4)")
    parser.add_argument(
        "--group-size", type=int, default=0, help="rollouts per task (0: demo config, paper 4)"
    )
    parser.add_argument(
        "--max-steps", type=int, default=0, help="steps per episode (0: demo config, paper 6)"
    )
    parser.add_argument("--unshared", action="store_true", help="also time roleagent without sharing")
    default_model = ROOT / "runs" / "demo" / "hf_warmstart"
    parser.add_argument(
        "--model",
        default=str(default_model) if default_model.is_dir() else "",
        help="warm-started Hugging Face directory to start from",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paper = args.regime == "paper"
        reasoning = args.reasoning_tokens if paper else 0
        results: dict[str, dict[str, float]] = {}
        runs = ["gigpo", "roleagent"] + (["roleagent_unshared"] if args.unshared else [])
        configs = {}
        for name in runs:
            algo = name.removesuffix("_unshared")
            c = base_config(Path(tmp) / name, args.iterations + 1, args.model)
            c.env.gen.dir = str(Path(tmp) / "games")
            c.algo = algo
            c.aiw.enabled = args.aiw
            c.rollout.tasks_per_iter = args.tasks or (4 if paper else c.rollout.tasks_per_iter)
            c.rollout.group_size = args.group_size or (4 if paper else c.rollout.group_size)
            c.env.max_steps = args.max_steps or (6 if paper else c.env.max_steps)
            if paper:
                c.wia.max_tokens = 128
                c.rollout.max_response_tokens += reasoning  # the action's budget follows the reasoning
            configs[name] = (c, name != algo)
        for name, timed in time_interleaved(configs, reasoning).items():
            measured = {k: v[1:] for k, v in timed.items()}
            res = results[name] = {k: float(np.mean(v)) for k, v in measured.items()}
            times, compiled = measured["seconds"], measured["compilations"]
            steady = [t for t, n in zip(times, compiled, strict=True) if not n]
            res["steady_seconds"] = float(np.mean(steady)) if steady else float("nan")
            print(
                f"{name:10s} {res['seconds']:.2f} s/iteration  ({', '.join(f'{t:.2f}' for t in times)};"
                f" compilations {', '.join(f'{n:.0f}' for n in compiled)};"
                f" {res['steady_seconds']:.2f} over the {len(steady)} without);"
                f" generation {res['generate_seconds']:.2f} s,"
                f" {res['decoded_row_tokens']:.0f} decoded row-tokens,"
                f" {res['prefilled_tokens']:.0f} prefilled tokens,"
                f" {res['decode_steps']:.0f} decode steps per iteration",
                flush=True,
            )
    g, r = results["gigpo"], results["roleagent"]
    overhead = r["seconds"] / g["seconds"] - 1.0
    steady = r["steady_seconds"] / g["steady_seconds"] - 1.0
    print(
        f"WIA{' + AIW' if args.aiw else ''} overhead ({args.regime} regime): {100 * overhead:.1f}% of wall time "
        f"({100 * steady:.1f}% over iterations that compiled nothing), "
        f"{100 * (r['decoded_row_tokens'] / g['decoded_row_tokens'] - 1):.1f}% decoded row-tokens, "
        f"{100 * (r['prefilled_tokens'] / g['prefilled_tokens'] - 1):.1f}% prefilled tokens (paper: 5.2% for WIA + AIW)"
    )
    record = {
        "bench": "overhead",
        "regime": args.regime,
        "gigpo_s_per_iter": g["seconds"],
        "roleagent_s_per_iter": r["seconds"],
        "overhead": overhead,
        "overhead_steady": steady,
        "aiw": args.aiw,
        "iterations": args.iterations,
    }
    if paper:
        record["reasoning_tokens"] = reasoning
    if args.unshared:
        u = results["roleagent_unshared"]
        record["unshared_s_per_iter"] = u["seconds"]
        record["unshared_generate_seconds_per_iter"] = u["generate_seconds"]
        record["sharing_generate_saving"] = 1.0 - r["generate_seconds"] / u["generate_seconds"]
        print(
            f"roleagent generation with sharing {r['generate_seconds']:.2f} s vs unshared "
            f"{u['generate_seconds']:.2f} s per iteration: {100 * record['sharing_generate_saving']:.0f}% less"
        )
    for name in ("generate_seconds", "decoded_row_tokens", "prefilled_tokens", "decode_steps"):
        record[f"gigpo_{name}_per_iter"] = g[name]
        record[f"roleagent_{name}_per_iter"] = r[name]
        record[f"overhead_{name}"] = r[name] / g[name] - 1.0 if g[name] else float("nan")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
