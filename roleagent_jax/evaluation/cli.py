"""The evaluation command line (`python -m roleagent_jax.evaluate`): flags, a trained model's settings as
their defaults, checks with one clear line each, then `panel.evaluate_trajectories` and its summary."""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from roleagent_jax.config import CONFIG, exit_codes
from roleagent_jax.config.schema import option_errors
from roleagent_jax.envs.base import Family
from roleagent_jax.envs.registry import get_family, registered
from roleagent_jax.evaluation.panel import (
    behaviour_text,
    evaluate_trajectories,
    make_policy,
    summarize,
    write_episodes,
)
from roleagent_jax.evaluation.trained_settings import SETTINGS_FILE, check_checkpoint, read_settings

DEFAULT_ENV = "alfworld"
# The flags a trained model's settings can fill in, with their defaults when nothing else does.
DEFAULTS = {"max_steps": 50, "temperature": 0.4, "greedy": False, "gen_n": 24, "gen_seed": 0, "limit": 0,
            "batch_size": 32, "seed": 0, "data": None}  # fmt: skip


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
