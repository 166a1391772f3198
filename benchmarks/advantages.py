"""Cost of GiGPO advantages against one training iteration, plus a row-loop implementation side by side.

    python benchmarks/advantages.py [--demo-iteration-s 30] [--reference-iteration-s 363] [--repeats 20]

Two batch sizes: the demo configuration (8 tasks x 4 rollouts x up to 15 steps) and the reference runs
(16 tasks x 8 rollouts = 128 environments x 50 steps = 6400 rows). Times are medians after compilation
and include the host-side id remapping. The iteration times to compare with are arguments: the demo
default is an estimate (replace it by the measured demo iteration), the reference default is the GiGPO
paper's 363 s iteration (where grouping plus advantages took 0.54 s). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import median_time, print_json  # noqa: E402
from roleagent_jax.rl.advantages import gigpo_advantages  # noqa: E402


def synthetic_rollouts(
    tasks: int, group: int, max_steps: int, seed: int = 0, full_length: bool = False
) -> dict:
    """Rows shaped like ALFWorld rollouts: terminal reward 10 on wins, repeated anchor states, invalid steps."""
    rng = np.random.default_rng(seed)
    cols = defaultdict(list)
    traj = 0
    for task in range(tasks):
        anchors = rng.integers(-(2**62), 2**62, size=3 * max_steps)
        for _ in range(group):
            won = rng.random() < 0.4
            length = max_steps if (full_length or not won) else int(rng.integers(3, max_steps + 1))
            for t in range(length):
                cols["rewards"].append(10.0 if (won and t == length - 1) else 0.0)
                cols["traj_ids"].append(traj)
                cols["group_ids"].append(task)
                cols["step_index"].append(t)
                # Early states repeat across rollouts (same start), later ones diverge.
                cols["anchor_hash"].append(anchors[min(int(rng.integers(0, t + 2)), len(anchors) - 1)])
                cols["valid"].append(rng.random() > 0.1)
                cols["return_multiplier"].append(1.0 + rng.random())
            traj += 1
    out = {k: np.asarray(v) for k, v in cols.items()}
    perm = rng.permutation(len(out["rewards"]))
    return {k: v[perm] for k, v in out.items()}


def loop_advantages(b: dict, gamma=0.95, omega=1.0, penalty=0.1, eps=1e-6) -> list[float]:
    """The same quantity with per-row Python loops and dicts (how public implementations do it)."""
    n = len(b["rewards"])
    rows_of = defaultdict(list)
    for i in range(n):
        rows_of[b["traj_ids"][i]].append(i)
    ret, total, mult = [0.0] * n, {}, {}
    for t, rows in rows_of.items():
        g = 0.0
        for i in sorted(rows, key=lambda j: b["step_index"][j], reverse=True):
            g = b["rewards"][i] + gamma * g
            ret[i] = g
        total[t] = sum(b["rewards"][i] for i in rows)
        mult[t] = sum(b["return_multiplier"][i] for i in rows) / len(rows)
    pen = [0.0 if b["valid"][i] else penalty for i in range(n)]
    score = [total[b["traj_ids"][i]] * mult[b["traj_ids"][i]] - pen[i] for i in range(n)]
    step_ret = [ret[i] * b["return_multiplier"][i] - pen[i] for i in range(n)]

    def norm(values, keys, singleton_zero):
        members = defaultdict(list)
        for i, k in enumerate(keys):
            members[k].append(i)
        out = [0.0] * n
        for rows in members.values():
            if len(rows) == 1:
                out[rows[0]] = 0.0 if singleton_zero else values[rows[0]] / (1.0 + eps)
                continue
            vals = [values[i] for i in rows]
            mean, std = statistics.fmean(vals), statistics.stdev(vals)
            for i in rows:
                out[i] = (values[i] - mean) / (std + eps)
        return out

    groups = [b["group_ids"][i] for i in range(n)]
    clusters = [(b["group_ids"][i], b["anchor_hash"][i]) for i in range(n)]
    a_e, a_s = norm(score, groups, False), norm(step_ret, clusters, True)
    return [a_e[i] + omega * a_s[i] for i in range(n)]


def measure(name: str, batch: dict, iteration_s: float, repeats: int) -> dict:
    def ours():
        return gigpo_advantages(**batch, gamma=0.95, omega=1.0, mode="mean_std_norm", invalid_penalty=0.1)

    got = ours()  # compile
    python_batch = {k: v.tolist() for k, v in batch.items()}
    want = np.asarray(loop_advantages(python_batch))
    max_err = float(np.max(np.abs(got - want)))
    t_ours = median_time(ours, repeats)
    t_loop = median_time(lambda: loop_advantages(python_batch), max(3, repeats // 5))
    rec = {
        "rows": int(len(batch["rewards"])),
        "ms": round(t_ours * 1e3, 3),
        "loop_ms": round(t_loop * 1e3, 3),
        "speedup_vs_loop": round(t_loop / t_ours, 2),
        "iteration_s": iteration_s,
        "percent_of_iteration": round(100.0 * t_ours / iteration_s, 5),
        "max_abs_diff_vs_loop": max_err,
    }
    print(
        f"{name:9s} rows={rec['rows']:5d}  gigpo_advantages {rec['ms']:8.3f} ms   row loops {rec['loop_ms']:8.2f} ms"
        f"  ({rec['speedup_vs_loop']:.1f}x)   = {rec['percent_of_iteration']:.4f}% of a {iteration_s:g} s iteration"
    )
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--demo-iteration-s", type=float, default=30.0, help="demo iteration time to compare with"
    )
    ap.add_argument("--reference-iteration-s", type=float, default=363.0, help="GiGPO paper's iteration time")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    demo = measure("demo", synthetic_rollouts(8, 4, 15), args.demo_iteration_s, args.repeats)
    ref = measure(
        "reference", synthetic_rollouts(16, 8, 50, full_length=True), args.reference_iteration_s, args.repeats
    )
    print_json(
        {
            "bench": "advantages",
            "device": str(jax.devices()[0].platform),
            "demo": demo,
            "reference": ref,
            "under_1_percent": bool(demo["percent_of_iteration"] < 1.0 and ref["percent_of_iteration"] < 1.0),
        }
    )


if __name__ == "__main__":
    main()
