"""Train an LLM agent with Role-Agent RL.

    python -m roleagent_jax.main --config=configs/demo.py
    python -m roleagent_jax.main --config=configs/alfworld.py --config.model.path=/ckpt/Qwen2.5-1.5B-Instruct \\
        --config.algo=gigpo --config.rollout.group_size=8

Any config value can be overridden with --config.<key>=<value>; see configs/base.py for every key.
A run resumes from its last checkpoint in --config.workdir when one exists.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Path to a config file (configs/demo.py, configs/alfworld.py); override keys with "
    "--config.<key>=<value>.",
    lock_config=True,
)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # keep library INFO chatter (orbax, XLA) off the console
    from roleagent_jax.trainer import Trainer  # heavy imports only once the flags are valid

    try:
        trainer = Trainer(_CONFIG.value)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    print_summary(summary)
    return 0


def _percent(value: float | None) -> str:
    """A success rate as a right-aligned percentage; a dash where it was not measured."""
    return f"{'-':>7s}" if value is None else f"{100 * value:6.1f}%"


def print_summary(summary: dict) -> None:
    """The before/after success table (per eval split) and where the report and model are."""
    ev = summary.get("eval", {})
    before, after = ev.get("before", {}), ev.get("after", {})
    for split in sorted(set(before) | set(after)):
        b, a = before.get(split, {}), after.get(split, {})
        types = [k for k in sorted(set(b) | set(a)) if k != "all"] + ["all"]
        print(f"\n{split}: success before -> after RL")
        for t in types:
            print(f"  {t:34s} {_percent(b.get(t))} -> {_percent(a.get(t))}")
    if "report" in summary:
        print(f"\nreport: {summary['report']}")
    print(f"final model (Hugging Face format): {summary.get('final_model')}")
    print(json.dumps(summary))


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
