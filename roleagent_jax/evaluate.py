"""Play every task of a split once with a policy and report success per task type.

    python -m roleagent_jax.evaluate --policy=expert --split=valid_seen --data=DIR
    python -m roleagent_jax.evaluate --env=alfworld --policy=random --split=gen_unseen --gen-n=24

The panel is fixed: the pool's task list, every task exactly once, each task's randomness seeded by
(seed, task id, step) so the result does not depend on worker count or batching. The last line printed
is one JSON object: {"split", "n", "success", "per_type", ...}.

A policy is any callable mapping a batch of `episodes.Turn` to response texts in the family's answer
format; the shared episode loop parses them. `--env` picks the family (default alfworld); the family's
own generation settings are flags too (ALFWorld: --num-receptacles, --num-objects).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from roleagent_jax.envs.base import Family, TaskPool, get_family, registered
from roleagent_jax.envs.pool import EnvPool
from roleagent_jax.episodes import Move, Turn, failed_games, play, success_summary
from roleagent_jax.types import Trajectory

Policy = Callable[[list[Turn]], list[str]]
DEFAULT_ENV = "alfworld"


class ExpertPolicy:
    """The family's expert: the first action of the plan the env computes for the current state."""

    needs_expert_plan = True

    def __init__(self, family: Family):
        self.family = family

    def __call__(self, batch: list[Turn]) -> list[str]:
        f = self.family
        return [f.format_action((x.observation.expert_plan or [f.empty_action])[0]) for x in batch]


class RandomPolicy:
    """The family's random response (a uniformly random admissible action, or random text for free-form
    families), seeded per (seed, task, step) for a reproducible panel."""

    needs_expert_plan = False

    def __init__(self, family: Family, seed: int = 0):
        self.family, self.seed = family, seed

    def __call__(self, batch: list[Turn]) -> list[str]:
        out = []
        for x in batch:
            rng = random.Random(f"{self.seed}:{x.task_id}:{x.step}")
            out.append(self.family.random_response(rng, x.goal, x.observation))
        return out


class PolicyAgent:
    """A policy as the episode loop's agent: one policy call per step, nothing after the last."""

    def __init__(self, policy: Policy):
        self.policy = policy

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None:
        if not turns:
            return None
        responses = self.policy(turns)
        if len(responses) != len(turns):
            raise ValueError(f"policy returned {len(responses)} responses for {len(turns)} inputs")
        return [Move(text) for text in responses]


def run_episodes(
    policy: Policy, family: Family, envs: EnvPool, task_ids: list[int], max_steps: int
) -> list[Trajectory]:
    """One episode per task id, all in lockstep on the pool's slots (the policy's prompt settings)."""
    return play(
        family,
        envs,
        task_ids,
        PolicyAgent(policy),
        max_steps=max_steps,
        history_k=int(getattr(policy, "history_k", 0)),
        expert=bool(getattr(policy, "needs_expert_plan", False)),
    ).trajectories


def summarize(
    split: str,
    trajs: Sequence[Trajectory],
    task_types: Sequence[str],
    score_name: str = "score",
    pool: TaskPool | None = None,
) -> dict:
    """Success overall and per task type (in the family's order), plus a few diagnostics: the one
    summary of an evaluation, for this command, the trainer's evaluations and the report. Families that
    score episodes (`Observation.score`) also get `score_name` and the mean score under that name, its
    standard error (`<score_name>_se`) and the mean per type (`per_type_<score_name>`); an episode that
    ended without a score counts 0. With the pool, the games whose environment failed, by name and reason.
    `wins` lists each game's outcome in task-id order, so two evaluations of the same games pair up (the paired
    difference's standard error, a fixed subset's rate)."""
    per_type = success_summary(trajs, task_types)
    del per_type["all"]
    n = len(trajs)
    steps = sum(len(t.steps) for t in trajs)
    invalid = sum(not s.valid for t in trajs for s in t.steps)
    out = {
        "split": split,
        "n": n,
        "success": sum(t.won for t in trajs) / max(n, 1),
        "per_type": per_type,
        "count_per_type": {k: sum(t.task_type == k for t in trajs) for k in per_type},
        "env_failed": sum(t.env_failed for t in trajs),
        "failed_games": failed_games(trajs, pool) if pool is not None else [],
        "invalid_rate": invalid / max(steps, 1),
        "mean_steps": steps / max(n, 1),
        "wins": [int(t.won) for t in sorted(trajs, key=lambda t: t.task_id)],
    }
    if any(t.score is not None for t in trajs):
        scores = {k: [t.score or 0.0 for t in trajs if t.task_type == k] for k in per_type}
        every = [t.score or 0.0 for t in trajs]
        out["score_name"] = score_name
        out[score_name] = sum(every) / n
        out[f"{score_name}_se"] = statistics.stdev(every) / math.sqrt(n) if n > 1 else 0.0
        out[f"per_type_{score_name}"] = {k: sum(v) / len(v) for k, v in scores.items()}
    return out


def evaluate(policy: Policy, family: Family, task_pool: TaskPool, split: str = "", **settings: Any) -> dict:
    """`summarize` of `evaluate_trajectories` (whose keyword settings it takes): every task of the pool
    once, or the first `limit`."""
    trajs = evaluate_trajectories(policy, family, task_pool, **settings)
    return summarize(split, trajs, family.task_types, family.score_name, task_pool)


def evaluate_trajectories(
    policy: Policy,
    family: Family,
    task_pool: TaskPool,
    *,
    num_workers: int = 2,
    max_steps: int = 50,
    batch_size: int = 32,
    step_timeout: float = 60.0,
    limit: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[Trajectory]:
    """Every task of the pool once (the first `limit` when limit > 0), batch_size episodes at a time: the
    episodes behind `evaluate`, for callers that measure more than its summary."""
    ids = list(range(len(task_pool)))[: limit or None]
    trajs: list[Trajectory] = []
    start = time.perf_counter()
    with EnvPool(
        family, task_pool, num_workers=num_workers, step_timeout=step_timeout, max_steps=max_steps
    ) as envs:
        for b in range(0, len(ids), batch_size):
            trajs += run_episodes(policy, family, envs, ids[b : b + batch_size], max_steps)
            if log:
                won = sum(t.won for t in trajs)
                log(f"[{len(trajs)}/{len(ids)}] won {won} ({time.perf_counter() - start:.0f}s)")
    return trajs


def make_policy(name: str, seed: int, checkpoint: str | None, temperature: float, family: Family) -> Policy:
    if checkpoint:
        from roleagent_jax.policy import ModelPolicy  # JAX and the model load only when needed

        return ModelPolicy(checkpoint, family, temperature, seed=seed)
    if name == "expert":
        if not family.has_expert:
            raise ValueError(
                f"environment {family.name!r} has no expert: use --policy=random or --checkpoint"
            )
        return ExpertPolicy(family)
    if name == "random":
        return RandomPolicy(family, seed)
    raise ValueError(f"unknown policy {name!r}: use expert, random, or --checkpoint=DIR")


def _option_value(text: str):
    """A generation setting from the command line: an int, a float, a range `lo,hi`, or text."""
    if "," in text:
        return tuple(_option_value(p) for p in text.split(","))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def build_parser(family: Family | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m roleagent_jax.evaluate",
        description="Play every task of a split once and print success per task type (last line: JSON).",
        epilog="Common use: --split and --data (real data) or --gen-n (generated games), --policy or "
        "--checkpoint, --limit, --num-workers. "
        "Documentation: README.md (quick start, real runs), python -m roleagent_jax.config (the trainer's keys), "
        "docs/ (experiments.md, scaling.md, adding-an-environment.md).",
    )
    p.add_argument("--env", default=DEFAULT_ENV, help=f"environment family ({', '.join(registered())})")
    p.add_argument("--policy", default="expert", choices=("expert", "random"), help="built-in policy")
    p.add_argument("--checkpoint", default=None, help="model checkpoint directory (overrides --policy)")
    p.add_argument("--temperature", type=float, default=0.4, help="sampling temperature for --checkpoint")
    p.add_argument(
        "--split",
        default="valid_seen",
        help="a real data split of the family (ALFWorld: valid_seen, valid_unseen, train, valid_train) or a "
        "generated one (ALFWorld: gen_seen, gen_unseen)",
    )
    p.add_argument(
        "--dataset",
        dest="split",
        help="a real data set by name, the same as --split (search_qa: nq, hotpotqa, ...; with --data=FILE)",
    )
    p.add_argument(
        "--data", default=None, help="the family's data folder or file (ALFWorld default: $ALFWORLD_DATA)"
    )
    p.add_argument(
        "--on-corrupt",
        default="fail",
        choices=("fail", "skip"),
        help="a real split's unreadable task file: stop naming it, or leave it out with a warning",
    )
    p.add_argument("--num-workers", type=int, default=2, help="environment worker processes")
    p.add_argument("--limit", type=int, default=0, help="play only the first N tasks (0 = all)")
    p.add_argument("--max-steps", type=int, default=50, help="steps per episode")
    p.add_argument("--batch-size", type=int, default=32, help="episodes played at once")
    p.add_argument(
        "--step-timeout", type=float, default=60.0, help="seconds before a silent worker is restarted"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random policy, or of the sampling with --checkpoint"
    )
    p.add_argument("--gen-n", type=int, default=24, help="tasks in a generated split")
    p.add_argument("--gen-seed", type=int, default=0, help="seed of a generated split")
    p.add_argument("--gen-dir", default=None, help="folder for generated tasks (default: $ROLEAGENT_GEN_DIR)")
    for key, default in (family.gen_options if family else {}).items():
        p.add_argument(
            "--" + key.replace("_", "-"),
            dest=f"option_{key}",
            type=_option_value,
            default=None,
            help=f"generation setting of {family.name} (default {default!r}; lo,hi for a range)",
        )
    p.add_argument("--quiet", action="store_true", help="print only the JSON line")
    return p


# (flag, smallest allowed value): counts that must be positive, or non-negative where 0 means "all".
CLI_MINIMA = (("max_steps", 1), ("batch_size", 1), ("num_workers", 1), ("limit", 0), ("gen_n", 1))


def check_args(args: argparse.Namespace) -> None:
    """Raise ValueError naming the first flag whose value is out of range."""
    for name, low in CLI_MINIMA:
        value = getattr(args, name)
        if value < low:
            raise ValueError(f"--{name.replace('_', '-')}={value}: must be >= {low}")
    if args.step_timeout <= 0:
        raise ValueError(f"--step-timeout={args.step_timeout}: must be > 0")
    if args.checkpoint is None and args.temperature < 0:
        raise ValueError(f"--temperature={args.temperature}: must be >= 0")


def main(argv: list[str] | None = None) -> dict:
    env_name = build_parser().parse_known_args(argv)[0].env
    try:
        family = get_family(env_name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    args = build_parser(family).parse_args(argv)
    options = {k: v for k in family.gen_options if (v := getattr(args, f"option_{k}")) is not None}
    try:
        check_args(args)
        family = family.configured(options)
        policy = make_policy(args.policy, args.seed, args.checkpoint, args.temperature, family)
        pool = family.task_pool(
            args.split,
            data_dir=args.data,
            gen_dir=args.gen_dir,
            n=args.gen_n,
            seed=args.gen_seed,
            options=options,
            **({} if args.split in family.generated_splits else {"on_corrupt": args.on_corrupt}),
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    summary = evaluate(
        policy,
        family,
        pool,
        args.split,
        num_workers=args.num_workers,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        step_timeout=args.step_timeout,
        limit=args.limit,
        log=log,
    )
    if not args.quiet:
        name = family.score_name
        scores = summary.get(f"per_type_{name}")
        for t, v in summary["per_type"].items():
            extra = f"  {name} {scores[t]:6.1%}" if scores else ""
            print(f"{t:34s} {v:6.1%}{extra}  ({summary['count_per_type'][t]} tasks)")
        extra = f"  {name} {summary[name]:6.1%}" if scores else ""
        print(f"{'all':34s} {summary['success']:6.1%}{extra}  ({summary['n']} tasks)")
        for game in summary["failed_games"]:
            print(f"environment failed (counted as a loss): {game['task']}: {game['reason']}")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
