"""Environment throughput: the worker pool against a single process, measured side by side.

    python benchmarks/envs.py [--envs 16] [--steps 20] [--workers 1,2,4]

Plays the same random admissible actions (fixed seed) on the same generated games in one process and
through EnvPool with each worker count, and times cold resets, cached resets and steps of one env.
Also side by side: one env with textworld's own rule-string parsers against the memoized ones, a game's
logic parsed whole (textworld) against the shared parse with the game's own task rule, and procedural
generation in one process against worker processes.
The last line is one JSON object {"bench": "envs", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from textworld.envs.pddl.logic import GameLogic

from roleagent_jax.envs import EnvPool, TaskPool, get_family
from roleagent_jax.envs.alfworld import procgen
from roleagent_jax.envs.alfworld.engine import (
    AlfWorldEnv,
    _logic_for,
    clear_caches,
    memoize_textworld_parsers,
)
from roleagent_jax.envs.alfworld.games import read_json
from roleagent_jax.envs.alfworld.procgen import generated_pool

ALFWORLD = get_family("alfworld")


def choose(admissible: list[str], seed: int, slot: int, step: int) -> str:
    return random.Random(f"{seed}:{slot}:{step}").choice(admissible)


def run_single(pool: TaskPool, n_envs: int, steps: int, seed: int) -> float:
    """steps/s of n_envs in-process environments stepped one after the other."""
    envs = [AlfWorldEnv(max_steps=10_000) for _ in range(n_envs)]
    tasks = [i % len(pool) for i in range(n_envs)]
    obs = [env.reset(pool[t]) for env, t in zip(envs, tasks)]  # warm: load + translate
    start = time.perf_counter()
    for t in range(steps):
        for i, env in enumerate(envs):
            obs[i] = env.step(choose(obs[i].admissible, seed, i, t))
            if obs[i].done:
                obs[i] = env.reset(pool[tasks[i]])
    return n_envs * steps / (time.perf_counter() - start)


def run_pool(pool: TaskPool, n_envs: int, steps: int, seed: int, workers: int) -> float:
    tasks = [i % len(pool) for i in range(n_envs)]
    with EnvPool(ALFWORLD, pool, num_workers=workers, step_timeout=120, max_steps=10_000) as envs:
        obs = envs.reset(tasks)
        start = time.perf_counter()
        for t in range(steps):
            out = envs.step({i: choose(obs[i].admissible, seed, i, t) for i in range(n_envs)})
            finished = [i for i in range(n_envs) if out[i].done]
            obs = [out[i] for i in range(n_envs)]
            if finished:  # keep every env playing, as the single-process run does
                for i, again in zip(finished, envs.reset([tasks[i] for i in finished])):
                    obs[i] = again
        return n_envs * steps / (time.perf_counter() - start)


def time_one_env(pool: TaskPool, repeats: int = 5) -> dict[str, float]:
    """Cold reset (first load of a game in a process), cached reset, and one step, in ms."""
    clear_caches()
    env = AlfWorldEnv(max_steps=10_000)
    files = [t.payload for t in pool.tasks]
    env.reset(files[-1])  # builds the engine (planner library copy) outside the timing
    cold = []
    for game in files[:3]:
        start = time.perf_counter()
        env.reset(game)
        cold.append(time.perf_counter() - start)
    warm, step = [], []
    for r in range(repeats):
        for game in files[:3]:
            start = time.perf_counter()
            obs = env.reset(game)
            warm.append(time.perf_counter() - start)
            for k in range(4):
                action = choose(obs.admissible, r, 0, k)
                start = time.perf_counter()
                obs = env.step(action)
                step.append(time.perf_counter() - start)
    ms = lambda xs: 1000 * sorted(xs)[len(xs) // 2]  # noqa: E731 (median)
    return {"reset_cold_ms": ms(cold), "reset_cached_ms": ms(warm), "step_ms": ms(step)}


def time_logic(pool: TaskPool) -> dict[str, float]:
    """ms per game to build its logic: textworld's own parse of each game's grammar (cold) vs ours, the
    grammar parsed once for all games with each game's task rule on top (memoized parsers)."""
    games = [read_json(t.payload) for t in pool.tasks]
    memoize_textworld_parsers(False)
    whole = 0.0
    for g in games:
        clear_caches()
        start = time.perf_counter()
        GameLogic(g["pddl_domain"], g["grammar"])
        whole += time.perf_counter() - start
    memoize_textworld_parsers(True)
    clear_caches()
    start = time.perf_counter()
    for g in games:
        _logic_for(g["pddl_domain"], g["grammar"])
    shared = time.perf_counter() - start
    return {"logic_whole_ms": 1000 * whole / len(games), "logic_shared_ms": 1000 * shared / len(games)}


def time_generation(n: int, workers: int) -> tuple[float, float]:
    """Seconds to generate n expert-checked games in one process, then in `workers` processes."""
    seconds = []
    for w in (1, workers):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            procgen.generate(tmp, n, seed=1, pool="seen", workers=w)
            seconds.append(time.perf_counter() - start)
    return seconds[0], seconds[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gen-games", type=int, default=48, help="games generated on each side of the comparison")
    args = p.parse_args()
    gen_workers = max(2, min(os.cpu_count() or 1, 8))
    if args.gen_games < 4 * gen_workers:  # generate() runs fewer games than that in one process
        p.error(f"--gen-games must be at least {4 * gen_workers} to use {gen_workers} processes")
    with tempfile.TemporaryDirectory() as tmp:
        pool = generated_pool(tmp, n=12, seed=0, pool="seen")
        memoize_textworld_parsers(False)
        plain = time_one_env(pool)
        memoize_textworld_parsers(True)
        timing = time_one_env(pool)
        timing.update({f"{k}_textworld_parsers": v for k, v in plain.items()})
        print(
            "one env, textworld's parsers -> memoized: "
            + ", ".join(
                f"{k} {plain[k]:.1f} -> {timing[k]:.1f} ({plain[k] / timing[k]:.1f}x)" for k in plain
            ),
            flush=True,
        )
        timing.update(time_logic(pool))
        print(
            f"game logic: whole parse {timing['logic_whole_ms']:.0f} ms, shared parse "
            f"{timing['logic_shared_ms']:.0f} ms ({timing['logic_whole_ms'] / timing['logic_shared_ms']:.1f}x)",
            flush=True,
        )
        one, many = time_generation(args.gen_games, gen_workers)
        timing.update({"generate_s_1_proc": one, f"generate_s_{gen_workers}_proc": many})
        print(
            f"generation of {args.gen_games} games: 1 process {one:.1f} s, {gen_workers} {many:.1f} s "
            f"({one / many:.2f}x)",
            flush=True,
        )
        single = run_single(pool, args.envs, args.steps, args.seed)
        print(f"single process: {single:.1f} steps/s", flush=True)
        pooled = {}
        for w in (int(x) for x in args.workers.split(",")):
            pooled[w] = run_pool(pool, args.envs, args.steps, args.seed, w)
            print(f"pool, {w} workers: {pooled[w]:.1f} steps/s ({pooled[w] / single:.2f}x)", flush=True)
    result = {
        "bench": "envs",
        "envs": args.envs,
        "gen_games": args.gen_games,
        "steps_per_env": args.steps,
        "single_steps_per_s": round(single, 2),
        "pool_steps_per_s": {str(w): round(v, 2) for w, v in pooled.items()},
        "speedup_vs_single": {str(w): round(v / single, 3) for w, v in pooled.items()},
        **{k: round(v, 2) for k, v in timing.items()},
        "cpu_count": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
