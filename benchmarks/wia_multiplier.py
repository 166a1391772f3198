"""How much of WIA's credit is the draw of which steps get a prediction (`wia.fraction` < 1)?

    python benchmarks/wia_multiplier.py [--fraction 0.3] [--draws 2000] [--lms 0.4]

A demo-sized task group (8 rollouts): three winners play the same five-step plan from the same states,
and a step's prediction scores the same for all three (each step's R_pre drawn once per trial around
`--lms`, the demo's measured mean LMS, +-0.3); five episodes fail after 15 steps. With every step
predicted the three winners' actions get identical advantages; whatever separates them at a lower
fraction is the draw of the prediction mask alone. For each `wia.fill` the benchmark draws
the prediction mask many times and reports the spread (standard deviation) of the advantage among the
three copies of one action, and of one copy's advantage across draws. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import print_json  # noqa: E402
from roleagent_jax.rl.advantages import gigpo_advantages  # noqa: E402
from roleagent_jax.wia.shaping import FILLS, fill_unscored, return_multiplier  # noqa: E402

WINNERS, LOSERS, PLAN, LOST_STEPS, WIN = 3, 5, 5, 15, 10.0


def group() -> dict[str, np.ndarray]:
    """Rows of one task group; the winners visit states 0..4, the losers states of their own."""
    traj, step, state, reward = [], [], [], []
    for e in range(WINNERS + LOSERS):
        won = e < WINNERS
        for t in range(PLAN if won else LOST_STEPS):
            traj.append(e)
            step.append(t)
            state.append(t if won else 100 + 7 * e + t % 7)
            reward.append(WIN if won and t == PLAN - 1 else 0.0)
    return {k: np.asarray(v) for k, v in dict(traj=traj, step=step, state=state, reward=reward).items()}


def advantages(g: dict[str, np.ndarray], scored: np.ndarray, lms: np.ndarray, fill: str) -> np.ndarray:
    r_pre = fill_unscored(np.where(scored, lms, 0.0), scored, np.zeros(len(scored), int), fill)
    return gigpo_advantages(
        g["reward"], g["traj"], np.zeros(len(scored), int), g["step"], g["state"], np.ones(len(scored), bool),
        mode="mean_norm", return_multiplier=return_multiplier(r_pre),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fraction", type=float, default=0.3, help="share of steps predicted (the demo's)")
    parser.add_argument("--draws", type=int, default=2000, help="prediction masks drawn")
    parser.add_argument("--lms", type=float, default=0.4, help="every prediction's R_pre")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    g = group()
    n = len(g["traj"])
    rng = np.random.default_rng(args.seed)
    masks = rng.random((args.draws, n)) < args.fraction
    step_lms = np.clip(args.lms + rng.uniform(-0.3, 0.3, (args.draws, LOST_STEPS)), 0.0, 1.0)
    lms = step_lms[:, g["step"]]  # one score per step, shared by every episode at that step
    copies = [np.flatnonzero((g["traj"] == e) & (g["step"] == 0))[0] for e in range(WINNERS)]
    exact = np.stack([advantages(g, np.ones(n, bool), x, "none")[copies] for x in lms])
    out = {}
    for fill in FILLS:
        adv = np.stack([advantages(g, m, x, fill)[copies] for m, x in zip(masks, lms)])
        out[fill] = {
            "spread_among_copies": float(adv.std(axis=1).mean()),
            "spread_across_draws": float(adv[:, 0].std()),
            "mean_advantage": float(adv.mean()),
            "mean_abs_error_vs_every_step": float(np.abs(adv - exact).mean()),
        }
        print(f"{fill:>11s}: spread among equal actions {out[fill]['spread_among_copies']:.3f}, "
              f"one action across draws {out[fill]['spread_across_draws']:.3f}, "
              f"mean {out[fill]['mean_advantage']:.3f} (every step predicted: {exact.mean():.3f}), "
              f"error against every step predicted {out[fill]['mean_abs_error_vs_every_step']:.3f}")  # fmt: skip
    print_json({"bench": "wia_multiplier", "fraction": args.fraction, "lms": args.lms, "draws": args.draws,
                "every_step_predicted": float(exact.mean()), "fill": out})  # fmt: skip


if __name__ == "__main__":
    main()
