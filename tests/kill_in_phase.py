"""The training command, SIGKILLed in the middle of one phase of the run.

    python tests/kill_in_phase.py PHASE AT --config=configs/demo.py --config.workdir=... ...

Everything after AT is the argv of ``python -m roleagent_jax.main``. The phase's function is wrapped
here, so the production code carries no test hooks; the process then dies as a power cut or an OOM
killer would leave it: no ``finally`` block, no atexit handler, no flush. Phases and what AT counts:

  warmstart   after SFT step AT (1-based) of the warm start
  rollout     in RL iteration AT (1-based), after the rollout's second environment step
  update      in RL iteration AT, after the first optimizer step of its update
  aiw         in RL iteration AT's AIW round, after the failure memory was appended and synced, before
              retrieval and the task sampler's update
  checkpoint  while RL checkpoint step AT is written: its files are in orbax's temporary folder, which
              is not yet renamed to the step

Before a kill outside the checkpoint phase, the checkpoints the run has started are waited for, so the
kill lands in the phase named and a resumed run starts from the last one. The line "kill_in_phase:
SIGKILL ..." on stderr says that the kill happened where it was asked for.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

PHASES = ("warmstart", "rollout", "update", "aiw", "checkpoint")
SETTLE_TIMEOUT = 300.0


def kill(where: str) -> None:
    print(f"kill_in_phase: SIGKILL {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def install(phase: str, at: int) -> None:
    """Wrap the functions of `phase` so that the process kills itself at `at`."""
    import jax
    import orbax.checkpoint._src.path.atomicity as atomicity

    from roleagent_jax.aiw import memory
    from roleagent_jax.envs import pool
    from roleagent_jax.run import checkpointing, trainer, warmstart

    started: list[Path] = []  # the step folders of every save the run started
    save = checkpointing.Checkpointer.save

    def recording_save(self, step, state, host, replace=False):
        started.append(self.directory / str(step))
        return save(self, step, state, host, replace=replace)

    checkpointing.Checkpointer.save = recording_save

    def settle() -> None:
        deadline = time.time() + SETTLE_TIMEOUT
        while not all(p.is_dir() for p in started):
            if time.time() > deadline:
                raise TimeoutError(f"checkpoints never finished: {[str(p) for p in started]}")
            time.sleep(0.05)

    current = {"iteration": 0}  # the RL iteration in progress (1-based), 0 outside one
    iteration = trainer.Trainer.iteration

    def tracked_iteration(self, it):
        current["iteration"] = it + 1
        try:
            return iteration(self, it)
        finally:
            current["iteration"] = 0

    trainer.Trainer.iteration = tracked_iteration

    if phase == "warmstart":
        make_sft_step = warmstart.make_sft_step

        def counting_make_sft_step(*args, **kwargs):
            step_fn, calls = make_sft_step(*args, **kwargs), [0]

            def step(*a):
                out = jax.block_until_ready(step_fn(*a))
                calls[0] += 1
                if calls[0] == at:
                    settle()
                    kill(f"in the warm start after SFT step {at}")
                return out

            return step

        warmstart.make_sft_step = counting_make_sft_step
    elif phase == "rollout":
        env_step, calls = pool.EnvPool.step, [0]

        def counting_step(self, actions):
            out = env_step(self, actions)
            if current["iteration"] == at:
                calls[0] += 1
                if calls[0] == 2:
                    settle()
                    kill(f"in the rollout of iteration {at} after 2 environment steps")
            return out

        pool.EnvPool.step = counting_step
    elif phase == "update":
        update = trainer.Trainer._update

        def killing_update(self, rows, adv, it):
            if it + 1 == at:
                train_step = self.train_step

                def step_then_kill(state, batch, frozen=None):
                    out = jax.block_until_ready(train_step(state, batch, frozen))
                    settle()
                    kill(f"in the update of iteration {at} after its first optimizer step")
                    return out

                self.train_step = step_then_kill
            return update(self, rows, adv, it)

        trainer.Trainer._update = killing_update
    elif phase == "aiw":
        add_many = memory.FailureMemory.add_many

        def add_then_kill(self, items):
            out = add_many(self, items)
            if current["iteration"] == at:
                settle()
                kill(f"in the AIW round of iteration {at} after {len(out)} failure records were appended")
            return out

        memory.FailureMemory.add_many = add_then_kill
    elif phase == "checkpoint":
        finalize = atomicity.AtomicRenameTemporaryPath.finalize

        @functools.wraps(finalize)
        async def kill_before_rename(self, *args, **kwargs):
            final = Path(self.get_final())
            if final.parent.name == "checkpoints" and final.name == str(at):
                kill(f"while writing checkpoint step {at}, its files in {self.get().name}")
            return await finalize(self, *args, **kwargs)

        atomicity.AtomicRenameTemporaryPath.finalize = kill_before_rename
    else:
        raise SystemExit(f"unknown phase {phase!r}: one of {', '.join(PHASES)}")


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    phase, at = sys.argv[1], int(sys.argv[2])
    install(phase, at)
    from roleagent_jax import main as cli

    sys.argv = ["roleagent_jax.main", *sys.argv[3:]]
    cli.run()


if __name__ == "__main__":
    main()
