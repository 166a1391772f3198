"""WIA's extra wall time per iteration: `roleagent` (WIA on, AIW off) against `gigpo`, same settings, same run.

    python benchmarks/overhead.py [--iterations 3] [--aiw] [--model runs/demo/hf_warmstart]

Both runs start from the same warm-started demo model (the demo's `hf_warmstart` when it exists, so the
predictor writes realistic predictions; otherwise a short warm start each); the first iteration
(compilation) is excluded.
The paper reports 5.2% for WIA + AIW together. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import ROOT, demo_config  # noqa: E402


def base_config(workdir: Path, iterations: int, model: str):
    c = demo_config()
    if model:
        c.model.path = model
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


def time_iterations(config) -> list[float]:
    from roleagent_jax.trainer import Trainer

    trainer = Trainer(config)
    try:
        trainer.warm_start()
        times = []
        for it in range(config.iterations):
            start = time.perf_counter()
            trainer.iteration(it)
            times.append(time.perf_counter() - start)
    finally:
        trainer.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--aiw", action="store_true", help="also turn AIW on for the roleagent run")
    default_model = ROOT / "runs" / "demo" / "hf_warmstart"
    parser.add_argument(
        "--model",
        default=str(default_model) if default_model.is_dir() else "",
        help="warm-started Hugging Face directory to start from",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for algo in ("gigpo", "roleagent"):
            c = base_config(Path(tmp) / algo, args.iterations + 1, args.model)
            c.env.gen.dir = str(Path(tmp) / "games")
            c.algo = algo
            c.aiw.enabled = args.aiw
            times = time_iterations(c)[1:]
            results[algo] = float(np.mean(times))
            print(f"{algo:10s} {results[algo]:.2f} s/iteration  ({', '.join(f'{t:.2f}' for t in times)})")
    overhead = results["roleagent"] / results["gigpo"] - 1.0
    print(f"WIA{' + AIW' if args.aiw else ''} overhead: {100 * overhead:.1f}% (paper: 5.2% for WIA + AIW)")
    print(
        json.dumps(
            {
                "bench": "overhead",
                "gigpo_s_per_iter": results["gigpo"],
                "roleagent_s_per_iter": results["roleagent"],
                "overhead": overhead,
                "aiw": args.aiw,
            }
        )
    )


if __name__ == "__main__":
    main()
