"""Play every game of a split once with a policy and report success per task type.

    python -m roleagent_jax.evaluate --policy=expert --split=valid_seen --data=DIR
    python -m roleagent_jax.evaluate --policy=random --split=gen_unseen --gen-n=24

The panel is fixed: the sorted game list, every game exactly once, each game's randomness seeded by
(seed, task id, step) so the result does not depend on worker count or batching. The last line printed
is one JSON object: {"split", "n", "success", "per_type", ...}.

A policy is any callable mapping a batch of `PolicyInput` to response texts in the agent format
(`<think>...</think><action>...</action>`); responses are parsed with `prompts.parse_action`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from roleagent_jax.envs.alfworld import TASK_TYPES
from roleagent_jax.envs.alfworld_tasks import TaskPool
from roleagent_jax.envs.pool import EnvPool
from roleagent_jax.envs.prompts import parse_action


@dataclass
class PolicyInput:
    """What a policy sees for one environment at one step."""

    task_id: int
    goal: str
    observation: str
    admissible: list[str]
    history: list[tuple[str, str]]  # earlier (observation, action) pairs, oldest first
    step: int
    info: dict = field(default_factory=dict)  # the env's info (expert_plan when the policy asks for it)


Policy = Callable[[list[PolicyInput]], list[str]]


class ExpertPolicy:
    """alfworld's expert: the first command of the plan the engine computes for the current state."""

    needs_expert_plan = True

    def __call__(self, batch: list[PolicyInput]) -> list[str]:
        return [f"<action>{(x.info.get('expert_plan') or ['look'])[0]}</action>" for x in batch]


class RandomPolicy:
    """A uniformly random admissible command, seeded per (seed, task, step) for a reproducible panel."""

    needs_expert_plan = False

    def __init__(self, seed: int = 0):
        self.seed = seed

    def __call__(self, batch: list[PolicyInput]) -> list[str]:
        out = []
        for x in batch:
            rng = random.Random(f"{self.seed}:{x.task_id}:{x.step}")
            out.append(f"<action>{rng.choice(x.admissible) if x.admissible else 'look'}</action>")
        return out


@dataclass
class EpisodeResult:
    task_id: int
    task_type: str
    won: bool
    steps: int
    invalid: int
    env_failed: bool


def run_episodes(
    policy: Policy, envs: EnvPool, task_ids: list[int], max_steps: int, expert: bool = False
) -> list[EpisodeResult]:
    """One episode per task id, all in lockstep on the pool's slots."""
    resets = envs.reset(task_ids, expert=expert)
    n = len(task_ids)
    obs = [o for o, _ in resets]
    infos = [i for _, i in resets]
    history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    results = [
        EpisodeResult(t, infos[i]["task_type"], False, 0, 0, bool(infos[i]["env_failed"]))
        for i, t in enumerate(task_ids)
    ]
    active = [i for i in range(n) if not results[i].env_failed]
    for step in range(max_steps):
        if not active:
            break
        batch = [
            PolicyInput(
                task_ids[i],
                infos[i]["goal"],
                obs[i],
                infos[i]["admissible_commands"],
                history[i],
                step,
                infos[i],
            )
            for i in active
        ]
        responses = policy(batch)
        if len(responses) != len(batch):
            raise ValueError(f"policy returned {len(responses)} responses for {len(batch)} inputs")
        actions = {}
        for i, text in zip(active, responses):
            action, valid = parse_action(text, infos[i]["admissible_commands"])
            results[i].invalid += int(not valid)
            actions[i] = action if action is not None else "look"
        outcomes = envs.step(actions)
        still = []
        for i in active:
            next_obs, _, done, info = outcomes[i]
            history[i].append((obs[i], actions[i]))
            obs[i], infos[i] = next_obs, info
            results[i].steps += 1
            results[i].won = results[i].won or bool(info.get("won"))
            results[i].env_failed = results[i].env_failed or bool(info.get("env_failed"))
            if not done:
                still.append(i)
        active = still
    return results


def summarize(split: str, results: list[EpisodeResult]) -> dict:
    """Success overall and per task type (types in ALFWorld's canonical order), plus a few diagnostics."""
    by_type: dict[str, list[float]] = defaultdict(list)
    for r in results:
        by_type[r.task_type].append(float(r.won))
    n = len(results)
    steps = sum(r.steps for r in results)
    return {
        "split": split,
        "n": n,
        "success": sum(r.won for r in results) / max(n, 1),
        "per_type": {t: sum(v) / len(v) for t in TASK_TYPES if (v := by_type.get(t))},
        "count_per_type": {t: len(v) for t in TASK_TYPES if (v := by_type.get(t))},
        "env_failed": sum(r.env_failed for r in results),
        "invalid_rate": sum(r.invalid for r in results) / max(steps, 1),
        "mean_steps": steps / max(n, 1),
    }


def evaluate(
    policy: Policy,
    task_pool: TaskPool,
    split: str = "",
    *,
    num_workers: int = 2,
    max_steps: int = 50,
    batch_size: int = 32,
    step_timeout: float = 60.0,
    limit: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Every game of the pool once (the first `limit` when limit > 0), batch_size episodes at a time."""
    ids = list(range(len(task_pool)))[: limit or None]
    expert = bool(getattr(policy, "needs_expert_plan", False))
    results: list[EpisodeResult] = []
    start = time.perf_counter()
    with EnvPool(task_pool, num_workers=num_workers, step_timeout=step_timeout, max_steps=max_steps) as envs:
        for b in range(0, len(ids), batch_size):
            results += run_episodes(policy, envs, ids[b : b + batch_size], max_steps, expert=expert)
            if log:
                won = sum(r.won for r in results)
                log(f"[{len(results)}/{len(ids)}] won {won} ({time.perf_counter() - start:.0f}s)")
    return summarize(split, results)


def make_policy(name: str, seed: int, checkpoint: str | None, temperature: float) -> Policy:
    if checkpoint:
        from roleagent_jax.policy import ModelPolicy  # JAX and the model load only when needed

        return ModelPolicy(checkpoint, temperature, seed=seed)
    if name == "expert":
        return ExpertPolicy()
    if name == "random":
        return RandomPolicy(seed)
    raise ValueError(f"unknown policy {name!r}: use expert, random, or --checkpoint=DIR")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m roleagent_jax.evaluate",
        description="Play every game of a split once and print success per task type (last line: JSON).",
    )
    p.add_argument("--policy", default="expert", choices=("expert", "random"), help="built-in policy")
    p.add_argument("--checkpoint", default=None, help="model checkpoint directory (overrides --policy)")
    p.add_argument("--temperature", type=float, default=0.4, help="sampling temperature for --checkpoint")
    p.add_argument(
        "--split",
        default="valid_seen",
        help="real split (valid_seen, valid_unseen, train, valid_train) or generated (gen_seen, gen_unseen)",
    )
    p.add_argument("--data", default=None, help="ALFWorld data folder (default: $ALFWORLD_DATA)")
    p.add_argument("--num-workers", type=int, default=2, help="environment worker processes")
    p.add_argument("--limit", type=int, default=0, help="play only the first N games (0 = all)")
    p.add_argument("--max-steps", type=int, default=50, help="steps per episode")
    p.add_argument("--batch-size", type=int, default=32, help="episodes played at once")
    p.add_argument(
        "--step-timeout", type=float, default=60.0, help="seconds before a silent worker is restarted"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random policy, or of the sampling with --checkpoint"
    )
    p.add_argument("--gen-n", type=int, default=24, help="games in a generated split")
    p.add_argument("--gen-seed", type=int, default=0, help="seed of a generated split")
    p.add_argument("--gen-dir", default=None, help="folder for generated games (default: $ROLEAGENT_GEN_DIR)")
    p.add_argument("--num-receptacles", type=int, default=None, help="receptacles per generated room")
    p.add_argument("--num-objects", type=int, default=None, help="distractor objects per generated room")
    p.add_argument("--quiet", action="store_true", help="print only the JSON line")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    size = {
        k: v for k, v in (("num_receptacles", args.num_receptacles), ("num_objects", args.num_objects)) if v
    }
    try:
        policy = make_policy(args.policy, args.seed, args.checkpoint, args.temperature)
        pool = TaskPool.for_split(
            args.split, args.data, gen_dir=args.gen_dir, gen_n=args.gen_n, gen_seed=args.gen_seed, **size
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    summary = evaluate(
        policy,
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
        for t, v in summary["per_type"].items():
            print(f"{t:34s} {v:6.1%}  ({summary['count_per_type'][t]} games)")
        print(f"{'all':34s} {summary['success']:6.1%}  ({summary['n']} games)")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
