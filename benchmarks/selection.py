"""Does task selection find the groups that teach? The task sampler against a simulated policy, no model.

    python benchmarks/selection.py [--tasks 240] [--iterations 20] [--tasks-per-iter 8] [--group 8]
                                   [--seeds 0 1 2] [--strength 1.0]

A pool of tasks of mixed difficulty in task types of their own difficulty (a type's tasks alike, as a
family's generator makes them): a third always won, a quarter never, the rest in between. The policy
is one skill logit per task, success sigmoid(skill). Each iteration draws `--tasks-per-iter` distinct
tasks from `aiw.TaskSampler` and plays `--group` Bernoulli episodes of each; a group whose episodes
disagree (some won, some lost) carries signal and trains: its task's skill rises by 0.6 and its type's
other tasks' by 0.15 (what a policy learns on one task transfers to its kind). A group all won or all
lost trains nothing. The run's episodes (20 x 8 = 160 draws) are fewer than the pool's 240 tasks, as
in a real run.

Arms, each on the same seeds' pools: `uniform` (the sampler's logits stay 0), `aiw` (each failed
task's self-boost, weighed by the sampler's learnability as `aiw.aiw_round` does, with the config's
`aiw.*` defaults), `learnability` (`aiw.selection = "learnability"`: p(1-p) of each task's success,
smoothed toward its type's) and `aiw+learnability`. Prints per arm the share of groups with signal and
the final success (mean over the whole pool), each as mean over seeds, and as the last line one JSON
object {"bench": "selection", "arms": {...}, "ahead": {arm: seeds on which it beats uniform on both}}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import mean_se, print_json  # noqa: E402
from roleagent_jax.aiw import TaskSampler  # noqa: E402
from roleagent_jax.config import CONFIG  # noqa: E402

ARMS = ("uniform", "aiw", "learnability", "aiw+learnability")
TYPES = 12
STEP, TRANSFER = 0.6, 0.15  # skill gained by a task trained with signal, and by its type's other tasks


def make_pool(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """Skill logits and task types: types of always won (skill 6), never won (-6) and in-between tasks
    (a type's own mean in [-2.5, 2.5], each task within 0.7 of it)."""
    kinds = np.array(["won"] * 4 + ["lost"] * 3 + ["between"] * 5)
    types = rng.integers(0, TYPES, size=n)
    centre = rng.uniform(-2.5, 2.5, size=TYPES)
    skill = np.where(kinds[types] == "won", 6.0, np.where(kinds[types] == "lost", -6.0, 0.0))
    between = kinds[types] == "between"
    skill[between] = centre[types[between]] + rng.uniform(-0.7, 0.7, size=between.sum())
    return skill, [f"type{t}" for t in types]


def sampler_for(arm: str, n: int, types: list[str], seed: int, strength: float) -> TaskSampler:
    aiw = {k: CONFIG.default(f"aiw.{k}") for k in ("eta", "decay", "temperature", "epsilon", "cap")}
    aiw.update(selection="learnability" if "learnability" in arm else "aiw", selection_strength=strength)
    return TaskSampler.from_config(n, aiw, seed=seed, task_types=types)


def run(arm: str, seed: int, args) -> dict[str, float]:
    """One simulated run: the share of groups with signal and the pool's mean success at the end."""
    rng = np.random.default_rng(seed)
    skill, types = make_pool(args.tasks, rng)
    type_of = np.unique(types, return_inverse=True)[1]
    sampler = sampler_for(arm, args.tasks, types, seed, args.strength)
    play = np.random.default_rng([seed, 1])  # the episodes' luck: the same stream for every arm
    floor = CONFIG.default("aiw.unlearnable_weight")
    signal = []
    for _ in range(args.iterations):
        tasks = sampler.sample(args.tasks_per_iter)
        p = 1.0 / (1.0 + np.exp(-skill[tasks]))
        wins = play.binomial(args.group, p)
        sampler.record(
            {int(t): w / args.group for t, w in zip(tasks, wins)}, plays={int(t): args.group for t in tasks}
        )
        taught = (wins > 0) & (wins < args.group)
        signal += taught.tolist()
        for t in tasks[taught]:
            skill[type_of == type_of[t]] += TRANSFER
            skill[t] += STEP - TRANSFER
        if arm.startswith("aiw"):  # failed tasks boosted by their self-boost, weighed by learnability
            failed = tasks[wins < args.group]
            sampler.update({int(t): sampler.learnability(int(t), floor) for t in failed})
    return {"signal": float(np.mean(signal)), "success": float(np.mean(1.0 / (1.0 + np.exp(-skill))))}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=240)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--tasks-per-iter", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--strength", type=float, default=CONFIG.default("aiw.selection_strength"))
    args = ap.parse_args(argv)
    runs = {arm: [run(arm, seed, args) for seed in args.seeds] for arm in ARMS}
    arms = {}
    for arm, results in runs.items():
        signal, signal_se = mean_se([r["signal"] for r in results])
        success, success_se = mean_se([r["success"] for r in results])
        arms[arm] = {"signal": round(signal, 4), "signal_se": round(signal_se, 4),
                     "success": round(success, 4), "success_se": round(success_se, 4),
                     "per_seed": [{k: round(v, 4) for k, v in r.items()} for r in results]}  # fmt: skip
        print(f"{arm:18s} groups with signal {100 * signal:5.1f}% +- {100 * signal_se:.1f}   "
              f"final success {100 * success:5.1f}% +- {100 * success_se:.1f}")  # fmt: skip
    base = runs["uniform"]
    ahead = {
        arm: sum(r["signal"] > b["signal"] and r["success"] > b["success"] for r, b in zip(runs[arm], base))
        for arm in ARMS[1:]
    }
    record = {"bench": "selection", "seeds": args.seeds, "tasks": args.tasks, "iterations": args.iterations,
              "tasks_per_iter": args.tasks_per_iter, "group": args.group, "strength": args.strength,
              "arms": arms, "ahead": ahead}  # fmt: skip
    print_json(record)
    return record


if __name__ == "__main__":
    main()
