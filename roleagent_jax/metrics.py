"""Metrics to stdout, to TensorBoard event files, and to a JSONL history (what the report plots read)."""

from __future__ import annotations

import json
import math
from pathlib import Path

ECHO_KEYS = (
    "train/success/all", "train/return", "train/episode_len", "train/valid_rate", "update/loss",
    "update/kl_ref", "update/entropy", "update/clip_frac", "wia/lms_mean", "wia/parse_rate",
    "aiw/n_failed", "aiw/max_prob", "rollout/tokens_per_s", "time/iteration",
)  # fmt: skip


class MetricLogger:
    """Scalars per iteration; `history` is kept in memory (and in checkpoints) for plots and resume."""

    def __init__(
        self,
        logdir: str | Path,
        tensorboard: bool = True,
        history: list[dict] | None = None,
        write: bool = True,
    ):
        self.logdir = Path(logdir)
        self.write = write  # False on every process but the first of a multi-host run
        if write:
            self.logdir.mkdir(parents=True, exist_ok=True)
        self.history: list[dict] = list(history or [])
        self._writer = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(self.logdir / "tb"))

    def log(self, step: int, scalars: dict[str, float], echo: bool = True) -> None:
        clean = {k: float(v) for k, v in scalars.items() if isinstance(v, int | float) and math.isfinite(v)}
        self.history.append({"step": step, **clean})
        if self._writer is not None:
            for key, value in clean.items():
                self._writer.add_scalar(key, value, step)
            self._writer.flush()
        if not self.write:
            return
        with open(self.logdir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if echo:
            keys = [k for k in ECHO_KEYS if k in clean] + [k for k in clean if k.startswith("eval/")]
            print(f"[iter {step}] " + "  ".join(f"{k}={clean[k]:.4g}" for k in keys), flush=True)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
