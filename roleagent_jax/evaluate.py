"""Play every task of a split once with a policy and report success per task type.

    python -m roleagent_jax.evaluate --policy=expert --split=valid_seen --data=DIR
    python -m roleagent_jax.evaluate --env=alfworld --policy=random --split=gen_unseen --gen-n=24

The panel is fixed: the pool's task list, every task exactly once, each task's randomness seeded by
(seed, task id, step) so the result does not depend on worker count or batching. The last line printed
on stdout is one JSON object: {"split", "n", "success", "per_type", "lost", ...}. Episodes lost to the
environment (a retriever down, a crashed or hung worker) count in no rate; more than --max-lost-share of
them exits 3 after the summary.

A policy is any callable mapping a batch of `episodes.Turn` to response texts in the family's answer
format; the shared episode loop parses them. `--env` picks the family (default alfworld); the family's
own generation settings are flags too (ALFWorld: --num-receptacles, --num-objects; a mapping such as
search QA's --mix as NAME=VALUE,NAME=VALUE or JSON).

A model the trainer exported (`--checkpoint=<workdir>/hf_final`, `hf_warmstart`) carries what its run
was trained and evaluated with (`trained_settings`): the family and its options, the episode length, the
evaluation's generated games (count and seed), games per split, decoding and sampling seed. They are the
defaults here, so `--checkpoint` and `--split` alone replay the run's own evaluation; a flag given
overrides its value, and a line on stderr says which.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from roleagent_jax import exit_codes
from roleagent_jax.config import CONFIG
from roleagent_jax.config.schema import option_errors
from roleagent_jax.envs.base import Family, TaskPool, get_family, registered
from roleagent_jax.envs.pool import EnvPool
from roleagent_jax.episodes import Move, Turn, counted, failed_games, lost_share, play, success_summary
from roleagent_jax.trained_settings import SETTINGS_FILE, check_checkpoint, read_settings
from roleagent_jax.types import Trajectory

Policy = Callable[[list[Turn]], list[str]]
DEFAULT_ENV = "alfworld"
# The flags a trained model's settings can fill in, with their defaults when nothing else does.
DEFAULTS = {"max_steps": 50, "temperature": 0.4, "greedy": False, "gen_n": 24, "gen_seed": 0, "limit": 0,
            "batch_size": 32, "seed": 0, "data": None}  # fmt: skip


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
    family: Family | None = None,
) -> dict:
    """Success overall and per task type (in the family's order), plus a few diagnostics: the one
    summary of an evaluation, for this command, the trainer's evaluations and the report. Families that
    score episodes (`Observation.score`) also get `score_name` and the mean score under that name, its
    standard error (`<score_name>_se`) and the mean per type (`per_type_<score_name>`); an episode that
    ended without a score counts 0. Episodes lost to their environment (a crashed or hung worker, a
    retriever that failed) are in no rate: `n` counts the others, `lost` and `lost_share` the lost ones,
    and with the pool `failed_games` names them with the reason. `wins` lists each game's outcome in
    task-id order (None for a lost one), so two evaluations of the same games pair up (the paired
    difference's standard error, a fixed subset's rate). With the family and the pool, `behaviour` holds
    the family's rates of what the episodes did (`Family.behaviour`), where it reports any, and
    `warnings` what it finds wrong with the environment (`Family.warnings`)."""
    played = trajs
    trajs = counted(played)
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
        "lost": len(played) - n,
        "lost_share": lost_share(played),
        "failed_games": failed_games(played, pool) if pool is not None else [],
        "invalid_rate": invalid / max(steps, 1),
        "mean_steps": steps / max(n, 1),
        "wins": [None if t.env_failed else int(t.won) for t in sorted(played, key=lambda t: t.task_id)],
    }
    if any(t.score is not None for t in trajs):
        scores = {k: [t.score or 0.0 for t in trajs if t.task_type == k] for k in per_type}
        every = [t.score or 0.0 for t in trajs]
        out["score_name"] = score_name
        out[score_name] = sum(every) / n
        out[f"{score_name}_se"] = statistics.stdev(every) / math.sqrt(n) if n > 1 else 0.0
        out[f"per_type_{score_name}"] = {k: sum(v) / len(v) for k, v in scores.items()}
    behaviour = family.behaviour(trajs, pool) if family is not None and pool is not None else {}
    if behaviour:
        out["behaviour"] = dict(behaviour)
    warnings = family.warnings(played) if family is not None else []
    if warnings:
        out["warnings"] = list(warnings)
    return out


def behaviour_value(value: float) -> str:
    """One `behaviour` number as the tables print it: a count (an int) as it is, a rate to three decimals."""
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def behaviour_text(behaviour: Mapping[str, float]) -> str:
    """A `behaviour` dict in one line of `name value` pairs."""
    return ", ".join(f"{k} {behaviour_value(v)}" for k, v in behaviour.items())


def evaluate(policy: Policy, family: Family, task_pool: TaskPool, split: str = "", **settings: Any) -> dict:
    """`summarize` of `evaluate_trajectories` (whose keyword settings it takes): every task of the pool
    once, or the first `limit`."""
    trajs = evaluate_trajectories(policy, family, task_pool, **settings)
    return summarize(split, trajs, family.task_types, family.score_name, task_pool, family)


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
    episodes behind `evaluate`, for callers that measure more than its summary (batch_size 0: all at once)."""
    ids = list(range(len(task_pool)))[: limit or None]
    batch_size = batch_size or len(ids)  # 0: every game at once, as the trainer's evaluation plays them
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


def episode_record(traj: Trajectory) -> dict:
    """One episode as plain JSON: what was asked, what the policy wrote and what came back at each step."""
    return {
        "task_id": traj.task_id,
        "task_type": traj.task_type,
        "goal": traj.goal,
        "won": traj.won,
        "score": traj.score,
        "env_failed": traj.env_failed,
        "steps": [
            {
                "response": s.response,
                "action": s.action,
                "valid": s.valid,
                "reward": s.reward,
                "result": s.next_observation,
            }
            for s in traj.steps
        ],
    }


def write_episodes(path: str | Path, trajs: Sequence[Trajectory]) -> None:
    """Every episode in task-id order, one JSON object a line; written whole or not at all (temp + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for t in sorted(trajs, key=lambda t: t.task_id):
            f.write(json.dumps(episode_record(t)) + "\n")
    tmp.replace(path)


def make_policy(
    name: str, seed: int, checkpoint: str | None, temperature: float, family: Family, greedy: bool = False
) -> Policy:
    if checkpoint:
        from roleagent_jax.policy import ModelPolicy  # JAX and the model load only when needed

        return ModelPolicy(checkpoint, family, temperature, seed=seed, greedy=greedy)
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
    """A generation setting from the command line: an int, a float, a range `lo,hi`, a mapping
    `name=value,name=value`, a JSON object or Python dict, or text."""
    if text.lstrip().startswith("{"):
        try:
            value = ast.literal_eval(text)  # JSON objects and Python dicts alike (as --config takes them)
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object or a Python dict")
        return value
    if "=" in text:
        return _mapping_value(text)
    if "," in text:
        return tuple(_option_value(p) for p in text.split(","))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _mapping_value(text: str) -> dict:
    """`name=value,name=value` as a dict (values read as `_option_value` reads them)."""
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: write a mapping as name=value,name=value or JSON")
        out[name.strip()] = _option_value(value.strip())
    return out


def _option_help(family: Family, key: str, default: Any) -> str:
    form = "name=value,name=value or JSON" if isinstance(default, dict) else "lo,hi for a range"
    text = ",".join(f"{k}={v}" for k, v in default.items()) if isinstance(default, dict) else repr(default)
    return f"setting of {family.name} (default {text}; {form}; a trained model's own by default)"


def build_parser(family: Family | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m roleagent_jax.evaluate",
        description="Play every task of a split once and print success per task type (last line: JSON).",
        epilog="Common use: --split and --data (real data) or --gen-n (generated games), --policy or "
        "--checkpoint, --limit, --num-workers. "
        "Documentation: README.md (quick start, real runs), python -m roleagent_jax.config (the trainer's keys), "
        "docs/ (experiments.md, scaling.md, adding-an-environment.md).",
    )
    p.add_argument(
        "--env",
        default=None,
        help=f"environment family ({', '.join(registered())}; default: a trained model's, else {DEFAULT_ENV})",
    )
    p.add_argument("--policy", default="expert", choices=("expert", "random"), help="built-in policy")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="model directory (overrides --policy); a trainer's export (hf_final, hf_warmstart) sets the "
        "defaults of the flags marked 'the run's' to what its run trained and evaluated with",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature for --checkpoint (default 0.4; the run's)",
    )
    p.add_argument(
        "--greedy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="greedy decoding for --checkpoint (default off; the run's)",
    )
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
        "--data",
        default=None,
        help="the family's data folder or file (ALFWorld default: $ALFWORLD_DATA; the run's)",
    )
    p.add_argument(
        "--on-corrupt",
        default="fail",
        choices=("fail", "skip"),
        help="a real split's unreadable task file: stop naming it, or leave it out with a warning",
    )
    p.add_argument("--num-workers", type=int, default=2, help="environment worker processes")
    p.add_argument("--limit", type=int, default=None, help="play only the first N tasks (0 = all; the run's)")
    p.add_argument("--max-steps", type=int, default=None, help="steps per episode (default 50; the run's)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="episodes played at once (default 32, 0 = all; the run's: all)",
    )
    p.add_argument(
        "--step-timeout", type=float, default=60.0, help="seconds before a silent worker is restarted"
    )
    p.add_argument(
        "--max-lost-share",
        type=float,
        default=CONFIG.default("env.max_lost_share"),
        help="share of the episodes that may be lost to the environment (retriever down, crashed or hung "
        "workers; they count in no rate) before the command exits 3 (default %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random policy, or of the sampling with --checkpoint (default 0; the run's)",
    )
    p.add_argument(
        "--gen-n", type=int, default=None, help="tasks in a generated split (default 24; the run's)"
    )
    p.add_argument(
        "--gen-seed", type=int, default=None, help="seed of a generated split (default 0; the run's)"
    )
    p.add_argument("--gen-dir", default=None, help="folder for generated tasks (default: $ROLEAGENT_GEN_DIR)")
    for key, default in (family.gen_options if family else {}).items():
        p.add_argument(
            "--" + key.replace("_", "-"),
            dest=f"option_{key}",
            type=_option_value,
            default=None,
            help=_option_help(family, key, default),
        )
    p.add_argument(
        "--episodes",
        default=None,
        metavar="FILE",
        help="also write every episode (task, each action with its result, the outcome) to FILE as JSON lines",
    )
    p.add_argument("--quiet", action="store_true", help="print only the JSON line")
    return p


# (flag, smallest allowed value): counts that must be positive, or non-negative where 0 means "all".
CLI_MINIMA = (("max_steps", 1), ("batch_size", 0), ("num_workers", 1), ("limit", 0), ("gen_n", 1))


def check_args(args: argparse.Namespace) -> None:
    """Raise ValueError naming the first flag whose value is out of range."""
    for name, low in CLI_MINIMA:
        value = getattr(args, name)
        if value < low:
            raise ValueError(f"--{name.replace('_', '-')}={value}: must be >= {low}")
    if args.step_timeout <= 0:
        raise ValueError(f"--step-timeout={args.step_timeout}: must be > 0")
    if not 0.0 <= args.max_lost_share <= 1.0:
        raise ValueError(f"--max-lost-share={args.max_lost_share}: must be between 0 and 1")
    if args.temperature < 0:
        raise ValueError(f"--temperature={args.temperature}: must be >= 0")
    if args.episodes is not None:
        folder = Path(args.episodes).parent
        if not folder.is_dir():
            raise ValueError(f"--episodes={args.episodes}: folder {str(folder)!r} does not exist")
        if Path(args.episodes).is_dir():
            raise ValueError(f"--episodes={args.episodes}: is a folder, not a file")
        try:  # an unnamed file: nothing is left behind, and root's writes are tried, not assumed
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise ValueError(
                f"--episodes={args.episodes}: cannot write in {str(folder)!r} ({err.strerror or err})"
            ) from err


def check_split(family: Family, split: str) -> None:
    """ValueError naming `split` and the family's known ones, before a model or data is loaded."""
    known = family.known_splits()
    if known is None:
        family.check_split(split)
    elif split not in known:
        raise ValueError(f"--split={split}: unknown {family.name} split; it knows {', '.join(known)}")


def check_options(family: Family, options: dict) -> None:
    """The family's options as the trainer checks its `env.<family>` keys (types, then its own rules)."""
    errors = option_errors(
        family, options, lambda name: f"--{name.replace('_', '-')}", f"{family.name} options"
    )
    if errors:
        raise ValueError(errors[0])


def trained_defaults(trained: dict, family: Family) -> tuple[dict, dict]:
    """The flag values and family options a trained model's settings give: its decoding always, its
    episode length, games and options only when it was trained on `family`."""
    run_eval, env = trained.get("eval", {}), trained.get("env", {})
    flags = {
        k: run_eval[k] for k in ("temperature", "greedy", "limit", "seed", "batch_size") if k in run_eval
    }
    if env.get("name") != family.name:
        return flags, {}
    flags |= {k: env[k] for k in ("max_steps", "gen_n", "gen_seed") if k in env}
    if env.get("data_dir"):
        flags["data"] = env["data_dir"]
    options = {k: _from_json(v) for k, v in env.get("options", {}).items()}  # checked by read_settings
    return flags, options


def _from_json(value: Any) -> Any:
    """An option as JSON stored it: lists back to tuples (ranges), mappings as they are."""
    return tuple(value) if isinstance(value, list) else value


def apply_defaults(args: argparse.Namespace, trained: dict, family: Family) -> tuple[dict, list[str]]:
    """Fill the flags not given from the trained model's settings, then `DEFAULTS`; return the family
    options to play with and, for each flag given that differs from the run's value, a note."""
    flags, run_options = trained_defaults(trained, family)
    notes = []
    for name, default in DEFAULTS.items():
        given = getattr(args, name)
        if given is None:
            setattr(args, name, flags.get(name, default))
        elif name in flags and given != flags[name]:
            notes.append(f"--{name.replace('_', '-')}={given} (the run's: {flags[name]})")
    options = dict(run_options)
    for key in family.gen_options:
        given = getattr(args, f"option_{key}")
        if given is None:
            continue
        if key in run_options and given != run_options[key]:
            notes.append(f"--{key.replace('_', '-')}={given} (the run's: {run_options[key]})")
        options[key] = given
    return options, notes


def _family_of(pre: argparse.Namespace, trained: dict) -> Family:
    """The family named by --env, else the one the checkpoint was trained on, else the default."""
    trained_env = trained.get("env", {}).get("name")
    family = get_family(pre.env or trained_env or DEFAULT_ENV)
    if trained_env and family.name != trained_env:
        print(
            f"note: {pre.checkpoint} was trained on {trained_env}; --env={pre.env} plays with "
            f"{pre.env}'s own defaults (only the run's decoding and prompt settings apply)",
            file=sys.stderr,
        )
    return family


def _trained_settings(checkpoint: str | None) -> dict:
    """The checkpoint's `roleagent.json` ({} without a checkpoint or file); a folder without a model
    (an adapter-only one names its base) fails here, before anything loads."""
    if not checkpoint:
        return {}
    check_checkpoint(Path(checkpoint))
    return read_settings(checkpoint)


def _as_trained_line(args: argparse.Namespace, family: Family) -> str:
    """What the run's settings made of the flags not given (one line on stderr)."""
    decoding = "greedy" if args.greedy else f"temperature {args.temperature}"
    games = (
        f"{args.gen_n} games, seed {args.gen_seed}" if args.split in family.generated_splits else args.split
    )
    return (
        f"as the run evaluated ({Path(args.checkpoint) / SETTINGS_FILE}): {family.name}, {games}, "
        f"{args.max_steps} steps, {decoding}, its {family.name} options"
    )


def _fail(exc: BaseException) -> NoReturn:
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from exc


def main(argv: list[str] | None = None) -> dict:
    pre = build_parser().parse_known_args(argv)[0]
    try:
        trained = _trained_settings(pre.checkpoint)
        family = _family_of(pre, trained)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc)
    args = build_parser(family).parse_args(argv)
    options, notes = apply_defaults(args, trained, family)
    try:
        check_args(args)
        check_options(family, options)
        check_split(family, args.split)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc)
    if trained.get("env") and not args.quiet:
        print(_as_trained_line(args, family), file=sys.stderr)
    if notes:
        print("the command line overrides the run's settings: " + ", ".join(notes), file=sys.stderr)
    try:
        family = family.configured(options)
        policy = make_policy(args.policy, args.seed, args.checkpoint, args.temperature, family, args.greedy)
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
        _fail(exc)
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    trajs = evaluate_trajectories(
        policy,
        family,
        pool,
        num_workers=args.num_workers,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        step_timeout=args.step_timeout,
        limit=args.limit,
        log=log,
    )
    summary = summarize(args.split, trajs, family.task_types, family.score_name, pool, family)
    if args.episodes is not None:
        try:
            write_episodes(args.episodes, trajs)
        except OSError as err:
            _fail(ValueError(f"--episodes={args.episodes}: cannot write it ({err.strerror or err})"))
    if not args.quiet:
        name = family.score_name
        scores = summary.get(f"per_type_{name}")
        for t, v in summary["per_type"].items():
            extra = f"  {name} {scores[t]:6.1%}" if scores else ""
            print(f"{t:34s} {v:6.1%}{extra}  ({summary['count_per_type'][t]} tasks)")
        extra = f"  {name} {summary[name]:6.1%}" if scores else ""
        print(f"{'all':34s} {summary['success']:6.1%}{extra}  ({summary['n']} tasks)")
        if summary.get("behaviour"):
            print(f"{'behaviour':34s} {behaviour_text(summary['behaviour'])}")
        for game in summary["failed_games"]:
            print(f"lost to the environment (not counted): {game['task']}: {game['reason']}")
    for line in summary.get("warnings", []):
        print(f"warning: {line}", file=sys.stderr)
    print(json.dumps(summary), flush=True)
    if summary["lost_share"] > args.max_lost_share:
        print(
            f"error: {summary['lost']} of {summary['lost'] + summary['n']} episodes were lost to the "
            f"environment, more than --max-lost-share={args.max_lost_share}: the figures above are not "
            "the policy's",
            file=sys.stderr,
        )
        raise SystemExit(exit_codes.ENV_OUTAGE)
    return summary


if __name__ == "__main__":
    main()
