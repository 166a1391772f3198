"""GiGPO's step credit: does grpo or gigpo learn faster where a detour still wins later?

    python benchmarks/credit.py [--seeds 0 1 2] [--iterations 30] [--max-steps 4]

The key-note family of the learning test (`tests/keyfamily.py`), with episodes of `--max-steps` steps
instead of 2: an agent that enters a wrong room can go back to the hall and still win, so a won
episode may hold a wrong turn. GRPO credits every step of a won episode alike; GiGPO also compares the
actions taken from the same state (the hall, whatever the step) and so can tell the wrong turn from the
right one. Both start from the same random-action warm start per seed (the test's recipe, its
`run_learning`). Prints iterations to 80% training success and the final success (mean of the last two
iterations), each mean +- standard error over seeds; a seed that never reaches 80% counts as the
budget (so that mean is a lower bound) and is reported. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the family and its runner live with the tests
from keylearning import run_learning  # noqa: E402

from benchmarks.common import mean_se, print_json  # noqa: E402

LEVEL = 0.8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=["grpo", "gigpo"], choices=["grpo", "gigpo"])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--max-steps", type=int, default=4, help="steps per episode (the test uses 2)")
    parser.add_argument("--workdir", default="runs/credit")
    args = parser.parse_args()
    start = time.perf_counter()
    curves: dict[str, dict[int, dict]] = {a: {} for a in args.algos}
    for seed in args.seeds:
        for algo in args.algos:
            overrides = {"algo": algo, "seed": seed, "iterations": args.iterations}
            overrides["env.max_steps"] = args.max_steps
            curve = run_learning(Path(args.workdir).absolute() / f"seed{seed}" / algo, overrides)
            reached = curve.iterations_to(LEVEL)
            curves[algo][seed] = {"success": curve.success, "to_80": reached, "final": curve.end}
            print(
                f"seed {seed} {algo}: start {curve.start:.2f} final {curve.end:.2f} to 80%: {reached}",
                flush=True,
            )
    summary = {}
    print(
        f"\n{len(args.seeds)} seeds, {args.iterations} iterations, {args.max_steps}-step episodes (mean +- SE)"
    )
    print(f"{'':8s}{'iterations to 80%':>24s}{'reached':>10s}{'final success %':>20s}")
    for algo, runs in curves.items():
        to = [r["to_80"] if r["to_80"] is not None else args.iterations for r in runs.values()]
        reached = sum(r["to_80"] is not None for r in runs.values())
        final = [100 * r["final"] for r in runs.values()]
        (tm, te), (fm, fe) = mean_se(to), mean_se(final)
        bound = ">=" if reached < len(runs) else "  "
        print(
            f"{algo:8s}{bound:>10s}{tm:6.1f} +- {te:4.1f}{f'{reached}/{len(runs)}':>10s}{fm:12.1f} +- {fe:4.1f}"
        )
        summary[algo] = {"iterations_to_80": [tm, te], "reached": reached, "final_success": [fm, fe]}
    print_json(
        {
            "bench": "credit",
            "seeds": args.seeds,
            "iterations": args.iterations,
            "max_steps": args.max_steps,
            "summary": summary,
            "per_seed": curves,
            "wall_s": time.perf_counter() - start,
        }
    )


if __name__ == "__main__":
    main()
