"""Train an LLM agent with Role-Agent RL.

    python -m roleagent_jax.main --config=configs/demo.py
    python -m roleagent_jax.main --config=configs/alfworld.py --config.model.path=/ckpt/Qwen2.5-1.5B-Instruct \\
        --config.algo=gigpo --config.rollout.group_size=8

Any config value can be overridden with --config.<key>=<value>. Every key, with its default, its
check and its meaning: python -m roleagent_jax.config (declared in roleagent_jax/config/keys.py).
A run resumes from its last checkpoint in --config.workdir when one exists; a workdir belongs to one run,
and a start there with settings that change what it trains is refused (docs/scaling.md lists the keys that
may change on a resume).

A mistake on the command line or in the files it names (an unknown key, a value out of range, a missing
or corrupt model directory or checkpoint) ends with one line naming it and exit code 2; --debug shows
the full traceback too. So do faults during the run: a workdir another run holds, a checkpoint that
cannot be written, a full disk (2); too many episodes lost to the environment (3); SIGINT or SIGTERM
(130, 143: the same command resumes). The codes are in roleagent_jax/config/exit_codes.py.

Common settings (--config.<key>=<value>):
  workdir                            checkpoints, logs/metrics.jsonl and report/report.md go here
  algo                               grpo | gigpo | roleagent (GiGPO + WIA + AIW)
  iterations                         RL iterations after the warm start
  model.path, tokenizer.path         a Hugging Face checkpoint folder (empty: a small random model)
  env.name, env.data_dir             the scenario family and its data folder
  env.train_split, env.eval_splits   where training and evaluation games come from
  rollout.tasks_per_iter, rollout.group_size   tasks per iteration and rollouts per task
  checkpoint.resume, checkpoint.overwrite      continue a run, or move an earlier one aside
  log.progress                       progress bars (False: plain lines, for log files)

Sections: model, lora, tokenizer, mesh, env (env.<family>: the family's own options), rollout,
advantage, loss, optim, train, wia, aiw, warmstart, eval, checkpoint, log.

Documentation: README.md (quick start, configuration, real runs), python -m roleagent_jax.config (every
key with its meaning and default; configs/base.py builds them), docs/ (experiments.md, scaling.md,
adding-an-environment.md).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

from roleagent_jax.config.exit_codes import (
    BUG,
    ENV_OUTAGE,
    USAGE,
    EnvironmentOutage,
    Interrupted,
    disk_full,
    interrupts,
    say,
)
from roleagent_jax.config.files import config_error, error_lines, fail

CLOSE_TIMEOUT_S = 600.0  # the last save of a large model may still be writing when a fault ends the run

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Path to a config file (configs/demo.py, configs/alfworld.py); override keys with "
    "--config.<key>=<value>.",
    lock_config=True,
)
flags.mark_flags_as_required(["config"])
_DEBUG = flags.DEFINE_bool("debug", False, "Show the full traceback of an error instead of one line.")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with each failure (a bad value, an unknown key, a config file that does not
    load) reported as one line naming it; --help prints the usage and exits 0."""
    if any(a in ("-h", "--help", "--helpshort") for a in argv[1:]):
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
    try:
        return flags.FLAGS(argv)
    except Exception as err:
        if "--debug" in argv:
            raise
        fail(config_error(err, argv))


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        fail(f"unexpected arguments: {' '.join(argv[1:])} (settings are --config.<key>=<value>)")
    logging.set_verbosity(logging.WARNING)  # keep library INFO chatter (orbax, XLA) off the console
    from roleagent_jax.run.trainer import Trainer  # heavy imports only once the flags are valid

    try:
        config = _CONFIG.value
        config.to_dict()  # a config file that failed to load raises on first use
    except Exception as err:
        if _DEBUG.value:
            raise
        fail(config_error(err, sys.argv))
    if not _DEBUG.value:  # orbax logs each failed write with a traceback; the one line below names it
        logging.get_absl_logger().addFilter(lambda record: "orbax" not in record.pathname)
    trainer, summary, fault = None, None, None
    with interrupts():
        try:
            trainer = Trainer(config, config_flags.get_config_filename(flags.FLAGS["config"]))
            summary = trainer.run()
        except BaseException as err:  # noqa: BLE001 - every fault ends in one line and its exit code
            fault = err
        closing = _close(trainer)
    fault = fault or closing
    if fault is not None:
        code, line = outcome(fault, str(getattr(trainer, "workdir", config.workdir)))
        if code == BUG or _DEBUG.value:
            traceback.print_exception(fault)
        if line:
            say(line)
        # Never a normal interpreter exit after a fault: orbax's non-daemon threads of a failed save
        # wait forever at shutdown, and a restart loop would never see the exit.
        sys.stdout.flush()
        os._exit(code)
    print_summary(summary)
    return 0


def _close(trainer) -> BaseException | None:
    """Close the trainer within CLOSE_TIMEOUT_S (a save still in flight included); its failure, if any."""
    if trainer is None:
        return None
    failure: list[BaseException] = []

    def close() -> None:
        try:
            trainer.close()
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            failure.append(err)

    thread = threading.Thread(target=close, name="close", daemon=True)
    thread.start()
    thread.join(CLOSE_TIMEOUT_S)
    if thread.is_alive():
        return TimeoutError(f"closing the run took over {CLOSE_TIMEOUT_S:.0f}s (a save that never ends)")
    return failure[0] if failure else None


def outcome(err: BaseException, workdir: str) -> tuple[int, str]:
    """The exit code and the one line for a fault that ended the run (`exit_codes`)."""
    from roleagent_jax.run.checkpointing import CheckpointError
    from roleagent_jax.run.lock import WorkdirBusy

    if isinstance(err, SystemExit):  # a refusal that already printed its line
        return (err.code if isinstance(err.code, int) else USAGE), ""
    if isinstance(err, Interrupted):
        return err.code, (
            f"stopped by {err}: the checkpoints in {workdir} are kept; run the same command to resume"
        )
    full = disk_full(err)
    if full is not None:
        where = f" ({full.filename})" if full.filename else ""
        return USAGE, (
            f"disk full writing to {workdir}{where}: {full.strerror}; nothing saved is lost: free space, "
            "then run the same command to resume"
        )
    if isinstance(err, EnvironmentOutage):
        return ENV_OUTAGE, f"{err}; the last checkpoint is kept: run the same command once it is back"
    user = (ValueError, CheckpointError, WorkdirBusy, OSError, TimeoutError)
    if isinstance(err, user):
        return USAGE, error_lines(str(err) or type(err).__name__)
    return BUG, ""


def _percent(value: float | None) -> str:
    """A success rate as a right-aligned percentage; a dash where it was not measured."""
    return f"{'-':>7s}" if value is None else f"{100 * value:6.1f}%"


def print_summary(summary: dict) -> None:
    """The before/after success table (per eval split, with the family's score where it has one) and
    where the report and model are."""
    from roleagent_jax.run.report import rates

    ev = summary.get("eval", {})
    before, after = ev.get("before", {}), ev.get("after", {})
    for split in sorted(set(before) | set(after)):
        sb, sa = before.get(split, {}), after.get(split, {})
        b, a = rates(sb), rates(sa)
        types = [k for k in sorted(set(b) | set(a)) if k != "all"] + ["all"]
        print(f"\n{split}: success before -> after RL")
        for t in types:
            print(f"  {t:34s} {_percent(b.get(t))} -> {_percent(a.get(t))}")
        name = (sa or sb).get("score_name")
        if name:
            print(f"  {name + ' (mean)':34s} {_percent(sb.get(name))} -> {_percent(sa.get(name))}")
    if "report" in summary:
        print(f"\nreport: {summary['report']}")
    print(f"final model (Hugging Face format): {summary.get('final_model')}")
    print(json.dumps(summary))


def run() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
