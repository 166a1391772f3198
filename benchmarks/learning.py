"""Does it learn, and which algorithm learns most? grpo vs gigpo vs roleagent on a demo, same budget.

    python benchmarks/learning.py [--env alfworld] [--seeds 0 1 2] [--iterations 12] [--panel 96 --draws 2]
    python benchmarks/learning.py --algos grpo gigpo wia aiw roleagent   # the paper's ablation table
    python benchmarks/learning.py --env webshop          # configs/webshop_demo.py; search_qa likewise
    python benchmarks/learning.py --config=configs/search_qa_smol.py --one-warmstart --seeds 0 1 \
        --algos gigpo roleagent                          # a real model: one warm start for every arm

`--env` picks the family's embedded default (alfworld: configs/demo.py); `--config` any config file
instead (loaded as the training command loads it), and `--set key=value` changes one of its keys for every
run (a recipe try), parsed as `--config.key=value` is. Success is the family's success rate (search-QA:
exact match).

`--one-warmstart` makes a single warm start (the first seed's), saved once and evaluated once, that every
seed and algorithm starts RL from: the seeds then differ in RL's sampling only. The gains are paired twice:
per seed against its warm start, and per game (the same held-out games before and after), whose standard
error is printed beside the one over seeds.

`--algos` runs any subset of the presets (grpo, gigpo, wia = GiGPO + WIA, aiw = GiGPO + AIW, roleagent;
default grpo gigpo roleagent). Per seed, one warm start (shared by the algorithms, so they start from
the same model) and one
evaluation of it; then each algorithm runs the demo's RL budget and is evaluated on the held-out
generated pools. Prints the table (mean +- standard error over seeds) and each algorithm's gain over its own seed's
warm start (paired); last line: one JSON object. A family that reports behaviour rates (search QA: how
often an episode searched a second time, on the questions that need one and on the others) gets a line
per model with each rate per seed, and `behaviour_per_seed` in the JSON.

A model's score moves by several points from one panel of tasks to another. `--panel N` also plays
every final model (and each warm start) on N fresh held-out tasks, once per sampling seed 1..draws,
and prints a second table with their mean. Finished runs in `--workdir` are
resumed, not retrained, so a panel can be added to an earlier run's folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import DEMO_CONFIGS, ROOT, mean_se, print_json  # noqa: E402
from roleagent_jax.config import ALGOS as PRESETS  # noqa: E402

DEFAULT_ALGOS = ("grpo", "gigpo", "roleagent")
PANEL_GEN_SEED = 2000  # far from the demo's pools (seeds 0 and 1000)
PANEL_BATCH = (
    48  # episodes per sampler batch: the draws depend on it (docs/experiments.md's evaluate command uses it)
)


def run(config) -> dict:
    from roleagent_jax.run.trainer import Trainer

    trainer = Trainer(config)
    try:
        return trainer.run()
    finally:
        trainer.close()


def panel_success(model_dir: Path, pool, config, draws: int, split: str) -> float:
    """Mean success of a saved model on `pool` over sampling seeds 1..draws (evaluate's code path), the
    family configured as the run's was (its prompt and rules: the demo's compact prompt, listed commands)."""
    from roleagent_jax.config import family_options
    from roleagent_jax.envs import get_family
    from roleagent_jax.evaluation.panel import evaluate
    from roleagent_jax.evaluation.policy import ModelPolicy

    family = get_family(config.env.name)
    family = family.configured(family_options(config, family))

    temperature = 0.0 if config.eval.greedy else config.eval.temperature
    scores = [
        evaluate(
            ModelPolicy(model_dir, family, temperature, seed=draw),
            family,
            pool,
            split,
            num_workers=config.env.num_workers,
            max_steps=config.env.max_steps,
            batch_size=PANEL_BATCH,
        )["success"]
        for draw in range(1, draws + 1)
    ]
    return float(np.mean(scores))


def load_configs(args: argparse.Namespace):
    """A function that builds a fresh config for every run: `--config` (else `--env`'s demo) loaded as the
    training command loads it, `--set KEY=VALUE` as its --config.KEY=VALUE flags. Checked once here, so a
    bad file, key or value (or a --warmstart folder that is no model) fails before any run, in one line."""
    from roleagent_jax.config import validate
    from roleagent_jax.config.files import fail, load_config_file

    path = args.config or str(ROOT / "configs" / f"{DEMO_CONFIGS[args.env]}.py")
    for item in args.set:
        if "=" not in item:
            fail(f"--set {item}: expected KEY=VALUE, a key of the config (python -m roleagent_jax.config)")
    try:
        first = load_config_file(path, args.set)
        if args.warmstart:  # what every arm then runs with
            first.model.path, first.warmstart.steps = str(Path(args.warmstart).absolute()), 0
        validate(first)
    except ValueError as err:
        fail(str(err))
    return lambda: load_config_file(path, args.set)


def paired_games(after: list[list[int]], before: list[int]) -> tuple[float, float]:
    """Mean and standard error of (after - before) per game, after averaged over seeds first: the held-out
    games are the sampling unit, so their own difficulty cancels."""
    d = np.mean(np.asarray(after, float), axis=0) - np.asarray(before, float)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))


def print_table(title: str, table: dict[str, dict[str, list[float]]], splits: list[str]) -> None:
    print(f"\n{title}")
    print(f"{'':12s}" + "".join(f"{s:>20s}" for s in splits))
    for name, row in table.items():
        cells = [f"{100 * m:8.1f} +- {100 * e:5.1f}" for m, e in (mean_se(row[s]) for s in splits)]
        print(f"{name:12s}" + "".join(f"{c:>20s}" for c in cells))


def gains(table: dict[str, dict[str, list[float]]], splits: list[str]) -> dict[str, dict[str, list[float]]]:
    """Each algorithm minus its own seed's warm start: paired, so the warm starts' spread cancels."""
    base = table["warm start"]
    return {
        name: {s: [a - b for a, b in zip(row[s], base[s], strict=True)] for s in splits}
        for name, row in table.items()
        if name != "warm start"
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", choices=sorted(DEMO_CONFIGS), default="alfworld", help="which demo to run")
    parser.add_argument("--config", default="", help="a config file (configs/x.py) instead of --env's demo")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a config key for every run, as --config.KEY=VALUE of the training "
                        "command (repeatable)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="RL iterations (default: the config's)")
    parser.add_argument("--workdir", default="runs/learning")
    parser.add_argument("--one-warmstart", action="store_true",
                        help="one warm start (the first seed's) for every seed and algorithm")  # fmt: skip
    parser.add_argument("--warmstart", default="",
                        help="an existing warm-started model folder (hf_warmstart) for every arm; the first "
                        "arm evaluates it before RL (implies --one-warmstart)")  # fmt: skip
    parser.add_argument("--panel", type=int, default=0, help="fresh unseen games per extra panel (0 = off)")
    parser.add_argument("--draws", type=int, default=2, help="sampling seeds on the extra panel")
    parser.add_argument(
        "--algos",
        nargs="*",
        choices=PRESETS,
        default=list(DEFAULT_ALGOS),
        help="presets to compare (none: warm starts only)",
    )
    args = parser.parse_args()
    if args.panel < 0 or args.draws < 1:
        parser.error("--panel must be >= 0 and --draws >= 1")
    if args.warmstart and not args.algos:
        parser.error("--warmstart needs at least one of --algos (the first arm evaluates the warm start)")
    config = load_configs(args)

    root = Path(args.workdir).absolute()
    table: dict[str, dict[str, list[float]]] = {a: {} for a in ("warm start", *dict.fromkeys(args.algos))}
    wins: dict[str, dict[str, list[list[int]]]] = {a: {} for a in table}  # per seed, per game
    behaviour: dict[str, dict[str, list[dict]]] = {a: {} for a in table}  # per seed: the family's rates
    panel_name = f"panel_{args.panel}"
    start = time.perf_counter()
    pool = None
    if args.panel:
        from roleagent_jax.envs import get_family

        demo = config()
        # the most held-out split (alfworld: gen_unseen); a family whose demo fixes its world (webshop's
        # shop_seed) gives the same goals for every seed, so there the panel replays the demo's own eval goals
        panel_split = demo.env.eval_splits[-1]
        pool = get_family(demo.env.name).task_pool(
            panel_split, gen_dir=root / "panel_games", n=args.panel, seed=PANEL_GEN_SEED,
            options=demo.env[demo.env.name].to_dict(),
        )  # fmt: skip
    warm_before = None
    for seed in args.seeds:
        base = config()
        base.seed = seed
        base.env.gen.dir = str(root / "games")
        base.log.progress = False
        if args.iterations is not None:
            base.iterations = args.iterations
        warm = base.copy_and_resolve_references()
        warm.seed = args.seeds[0] if args.one_warmstart else seed
        warm.workdir = str(root / ("warmstart" if args.one_warmstart else f"seed{seed}/warmstart"))
        warm.iterations = 0
        warm_model = (
            Path(args.warmstart).absolute() if args.warmstart else Path(warm.workdir) / "hf_warmstart"
        )
        if not args.warmstart and (warm_before is None or not args.one_warmstart):
            warm_before = run(warm)["eval"]["before"]
            print(f"seed {warm.seed} warm start: " + json.dumps(brief(warm_before)), flush=True)
        models = {"warm start": warm_model}
        for algo in dict.fromkeys(args.algos):
            c = base.copy_and_resolve_references()
            c.algo = algo
            c.workdir = str(root / f"seed{seed}" / algo)
            c.model.path = str(warm_model)
            c.warmstart.steps = 0
            c.eval.before = warm_before is None  # a given warm start: its first arm evaluates it
            summary = run(c)
            if warm_before is None:
                warm_before = summary["eval"]["before"]
                print("warm start: " + json.dumps(brief(warm_before)), flush=True)
            for split, res in summary["eval"]["after"].items():
                table[algo].setdefault(split, []).append(res["success"])
                wins[algo].setdefault(split, []).append(res.get("wins", []))
                behaviour[algo].setdefault(split, []).append(res.get("behaviour", {}))
            print(f"seed {seed} {algo}: " + json.dumps(brief(summary["eval"]["after"])), flush=True)
            models[algo] = Path(summary["final_model"])
        for split, res in warm_before.items():
            table["warm start"].setdefault(split, []).append(res["success"])
            wins["warm start"].setdefault(split, []).append(res.get("wins", []))
            behaviour["warm start"].setdefault(split, []).append(res.get("behaviour", {}))
        if pool is not None:
            for name, model_dir in models.items():
                score = panel_success(model_dir, pool, base, args.draws, panel_split)
                table[name].setdefault(panel_name, []).append(score)
                print(f"seed {seed} {name} on {args.panel} fresh unseen games: {100 * score:.1f}", flush=True)
    splits = sorted(s for s in table["warm start"] if s != panel_name)
    n = len(args.seeds)
    print_table(f"success % on held-out tasks ({n} seeds, mean +- standard error)", table, splits)
    print_table(f"gain over the seed's warm start, points ({n} seeds, mean +- standard error)",
                gains(table, splits), splits)  # fmt: skip
    per_game = {
        algo: {s: paired_games(wins[algo][s], wins["warm start"][s][0]) for s in splits}
        for algo in args.algos
        if all(wins[algo].get(s) and all(wins[algo][s]) for s in splits)
        and (args.one_warmstart or args.warmstart)
    }
    behaviour_per_seed = reported(behaviour)
    if behaviour_per_seed:
        print(f"\nbehaviour on held-out tasks, by the family's own measure (each value: per seed, {n} seeds)")
        for line in behaviour_lines(behaviour_per_seed):
            print(line)
    if per_game:
        print(f"\ngain over the warm start, points, paired per game (mean of {n} seeds +- SE over games)")
        for algo, row in per_game.items():
            print(f"{algo:12s}" + "".join(f"{100 * m:12.1f} +- {100 * e:5.1f}" for m, e in row.values()))
    if pool is not None:
        print_table(
            f"success % on {args.panel} fresh held-out tasks, mean of {args.draws} draws ({n} seeds, mean +- SE)",
            table,
            [panel_name],
        )
    out = {name: {s: mean_se(v) for s, v in row.items()} for name, row in table.items()}
    per_seed = {name: {s: [float(x) for x in v] for s, v in row.items()} for name, row in table.items()}
    print_json(
        {
            "bench": "learning",
            "config": args.config or f"configs/{DEMO_CONFIGS[args.env]}.py",
            "set": args.set,
            "one_warmstart": args.one_warmstart or bool(args.warmstart),
            "warmstart": args.warmstart,
            "seeds": args.seeds,
            "success_mean_se": out,
            "success_per_seed": per_seed,
            "gain_paired_per_game": per_game,
            "behaviour_per_seed": behaviour_per_seed,
            "wall_s": time.perf_counter() - start,
        }
    )


def reported(behaviour: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, list[dict]]]:
    """The models and splits whose evaluations reported behaviour rates (`evaluation.panel.summarize`'s
    `behaviour`), each with its per-seed dicts; {} when the family reports none."""
    kept = {name: {s: v for s, v in row.items() if any(v)} for name, row in behaviour.items()}
    return {name: row for name, row in kept.items() if row}


def behaviour_lines(behaviour: dict[str, dict[str, list[dict]]]) -> list[str]:
    """One line per model: for each split, each rate with its value per seed ("-" where a seed's
    evaluation did not report it)."""
    from roleagent_jax.evaluation.panel import behaviour_value

    lines = []
    for name, row in behaviour.items():
        cells = []
        for split, per_seed in row.items():
            keys = dict.fromkeys(k for b in per_seed for k in b)
            values = {k: "/".join(behaviour_value(b[k]) if k in b else "-" for b in per_seed) for k in keys}
            cells.append(f"{split}: " + ", ".join(f"{k} {v}" for k, v in values.items()))
        lines.append(f"{name:12s}" + "; ".join(cells))
    return lines


def brief(evals: dict) -> dict:
    """An evaluation's summaries without the per-game lists, for the progress lines."""
    return {split: {k: v for k, v in res.items() if k != "wins"} for split, res in evals.items()}


if __name__ == "__main__":
    main()
