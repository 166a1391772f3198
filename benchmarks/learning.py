"""Does it learn, and which algorithm learns most? grpo vs gigpo vs roleagent on the demo, same budget.

    python benchmarks/learning.py [--seeds 0 1 2] [--iterations 12]

Per seed, one warm start (shared by the three algorithms, so they start from the same model) and one
evaluation of it; then each algorithm runs the demo's RL budget and is evaluated on the held-out
generated pools. Prints the table (mean +- std over seeds); last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import demo_config  # noqa: E402

ALGOS = ("grpo", "gigpo", "roleagent")


def run(config) -> dict:
    from roleagent_jax.trainer import Trainer

    trainer = Trainer(config)
    try:
        return trainer.run()
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="RL iterations (default: the demo's)")
    parser.add_argument("--workdir", default="runs/learning")
    args = parser.parse_args()
    root = Path(args.workdir).absolute()
    table: dict[str, dict[str, list[float]]] = {a: {} for a in ("warm start", *ALGOS)}
    start = time.perf_counter()
    for seed in args.seeds:
        base = demo_config()
        base.seed = seed
        base.env.gen.dir = str(root / "games")
        base.log.progress = False
        if args.iterations is not None:
            base.iterations = args.iterations
        warm = base.copy_and_resolve_references()
        warm.workdir = str(root / f"seed{seed}" / "warmstart")
        warm.iterations = 0
        summary = run(warm)
        for split, res in summary["eval"]["before"].items():
            table["warm start"].setdefault(split, []).append(res["all"])
        print(f"seed {seed} warm start: " + json.dumps(summary["eval"]["before"]), flush=True)
        for algo in ALGOS:
            c = base.copy_and_resolve_references()
            c.algo = algo
            c.workdir = str(root / f"seed{seed}" / algo)
            c.model.path = str(Path(warm.workdir) / "hf_warmstart")
            c.warmstart.steps = 0
            c.eval.before = False
            summary = run(c)
            for split, res in summary["eval"]["after"].items():
                table[algo].setdefault(split, []).append(res["all"])
            print(f"seed {seed} {algo}: " + json.dumps(summary["eval"]["after"]), flush=True)
    splits = sorted(table["warm start"])
    print(f"\nsuccess % on held-out generated games ({len(args.seeds)} seeds, mean +- std)")
    print(f"{'':12s}" + "".join(f"{s:>20s}" for s in splits))
    for name, row in table.items():
        cells = [f"{100 * np.mean(row[s]):8.1f} +- {100 * np.std(row[s]):5.1f}" for s in splits]
        print(f"{name:12s}" + "".join(f"{c:>20s}" for c in cells))
    out = {
        name: {s: [float(np.mean(v)), float(np.std(v))] for s, v in row.items()}
        for name, row in table.items()
    }
    print(
        json.dumps(
            {
                "bench": "learning",
                "seeds": args.seeds,
                "success_mean_std": out,
                "wall_s": time.perf_counter() - start,
            }
        )
    )


if __name__ == "__main__":
    main()
