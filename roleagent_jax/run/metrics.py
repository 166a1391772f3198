"""Metrics to stdout, to TensorBoard event files, and to a JSONL history (what the report plots read)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from roleagent_jax.envs.episodes import success_summary
from roleagent_jax.types import Row

if TYPE_CHECKING:
    from roleagent_jax.run.rollout import RolloutResult

ECHO_KEYS = (
    "train/success/all", "train/return", "train/episode_len", "train/valid_rate", "train/uniform_groups",
    "update/loss", "update/kl_ref", "update/entropy", "update/clip_frac", "wia/lms_mean", "wia/parse_rate",
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
        self._tensorboard = tensorboard
        self._purge_step: int | None = None
        self._writer = None

    def resume_at(self, step: int) -> None:
        """Forget every record after ``step`` (the restored iteration; 0 for a fresh run), in the JSONL
        file and in TensorBoard, so a resumed run never shows a step twice."""
        self.history = [h for h in self.history if h["step"] <= step]
        self._purge_step = step + 1  # TensorBoard hides this run's events from here on
        path = self.logdir / "metrics.jsonl"
        if not self.write or not path.is_file():
            return
        records = [(line, _step_of(line)) for line in path.read_text().splitlines()]
        kept = [line for line, s in records if s is not None and s <= step]
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)

    def _tb(self):
        if self._writer is None and self._tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(self.logdir / "tb"), purge_step=self._purge_step)
        return self._writer

    def log(self, step: int, scalars: dict[str, float], echo: bool = True) -> None:
        clean = {k: float(v) for k, v in scalars.items() if isinstance(v, int | float) and math.isfinite(v)}
        self.history.append({"step": step, **clean})
        if self._tb() is not None:
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


def _step_of(line: str) -> int | None:
    """The step of one JSONL record; None for a line a kill cut short."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def iteration_metrics(
    metrics: dict[str, float],
    result: RolloutResult,
    rows: Sequence[Row],
    adv: np.ndarray,
    task_types: Sequence[str],
    times: dict[str, float],
) -> dict[str, float]:
    """An iteration's scalars: `metrics` (WIA, update, AIW) with the rollout's success per task type,
    return, validity, row and advantage sizes, sampler throughput and each phase's seconds. `rows` are
    the rows trained on (with predictor rows, when those train)."""
    trajs, stats = result.trajectories, result.stats
    out = dict(metrics)
    out.update({f"train/success/{k}": v for k, v in success_summary(trajs, task_types).items()})
    out.update(
        {
            "train/return": float(np.mean([t.total_reward for t in trajs])),
            "train/episode_len": float(np.mean([len(t.steps) for t in trajs])),
            "train/valid_rate": float(np.mean([r.valid for r in result.rows])) if result.rows else 0.0,
            "train/rows": len(rows),
            "train/adv_abs": float(np.abs(adv).mean()) if len(adv) else 0.0,
            "train/env_failed": float(np.sum([t.env_failed for t in trajs])),
            "rollout/sampler_calls": stats["sampler_calls"],
            "rollout/tokens_per_s": stats["generated_tokens"] / max(stats["time_generate"], 1e-9),
            "rollout/prompts_truncated": stats["prompts_truncated"],
            "time/generate": stats["time_generate"],
            "time/env": stats["time_env"],
        }
    )
    out.update(generation_parts(stats))
    out.update(branch_success(stats))
    out.update({f"time/{k}": v for k, v in times.items()})
    return out


def generation_parts(stats: dict[str, float]) -> dict[str, float]:
    """What the backend said of its calls (`rollout.backend_growth`): the seconds of each phase of
    generation as `time/generate/<phase>` (the jax backend: `prefill`, `decode`; the rest of
    `time/generate` is host work: planning, padding, detokenizing) and its counts as `rollout/<name>`
    (`compilations`: programs compiled during the rollout)."""
    out = {}
    for k, v in stats.items():
        if k.startswith("time_generate/"):
            out[f"time/generate/{k.partition('/')[2]}"] = v
        elif k.startswith("generate/"):
            out[f"rollout/{k.partition('/')[2]}"] = v
    return out


def branch_success(stats: dict[str, float]) -> dict[str, float]:
    """Success of the branches each forced opener started, per task type and overall
    (`rollout/branch_success/<opener>/<type>`): whether the contrast the branches exist for is there,
    e.g. a second <search> winning bridge questions that an <answer> at the same state loses."""
    prefix = "branch_episodes/"
    return {
        f"rollout/branch_success/{k[len(prefix) :]}": stats[f"branch_wins/{k[len(prefix) :]}"] / n
        for k, n in stats.items()
        if k.startswith(prefix) and n
    }


def eval_metrics(split: str, summary: dict) -> dict[str, float]:
    """An evaluation summary (`evaluation.panel.summarize`) as scalars: success overall (`all`) and per task
    type, the number of games played, and the family's score (WebShop's score, search-QA's EM) where it
    has one."""
    out = {f"eval/{split}/{k}": v for k, v in summary["per_type"].items()}
    out[f"eval/{split}/all"] = summary["success"]
    out[f"eval/{split}/games"] = float(summary["n"])
    if "score_name" in summary:
        out[f"eval/{split}/{summary['score_name']}"] = summary[summary["score_name"]]
    return out
