"""The training command with one fault injected where no test hook reaches (orbax's background write).

    python tests/fault_in_run.py FAULT --config=configs/demo.py --config.workdir=... ...

Everything after FAULT is the argv of ``python -m roleagent_jax.main``. Faults:

  save_enospc   every checkpoint write fails in orbax's background thread with "No space left on device"
  metrics_enospc  the metrics log's first append fails with "No space left on device"
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

FAULTS = ("save_enospc", "metrics_enospc")


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def install(fault: str) -> None:
    if fault == "save_enospc":
        import orbax.checkpoint._src.path.atomicity as atomicity

        atomicity.AtomicRenameTemporaryPath.finalize = disk_full
    elif fault == "metrics_enospc":
        from roleagent_jax.run import metrics

        metrics.MetricLogger.log = disk_full


if __name__ == "__main__":
    fault = sys.argv[1]
    if fault not in FAULTS:
        sys.exit(f"fault must be one of {FAULTS}")
    install(fault)
    from roleagent_jax.main import run

    sys.argv = [sys.argv[0], *sys.argv[2:]]
    run()
