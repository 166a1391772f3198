"""PNG reports of AIW over training: failure types per iteration, sampling mass per task type.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so it is
safe inside a training process and on machines without a display.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _table(history: Sequence[dict], key: str) -> tuple[list[int], list[str], np.ndarray]:
    iters = [int(h["iteration"]) for h in history]
    names = sorted({n for h in history for n in h.get(key, {})})
    table = np.array([[float(h.get(key, {}).get(n, 0.0)) for h in history] for n in names]).reshape(
        len(names), len(iters)
    )
    return iters, names, table


def _stack(ax, iters, names, table, title: str, ylabel: str) -> None:
    if names:
        ax.stackplot(iters, table, labels=names)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)


def plot_aiw_history(history: Sequence[dict], path: str | os.PathLike) -> Path:
    """Two panels: failure-type counts per iteration (stacked) and the sampling share per task type."""
    if not history:
        raise ValueError("AIW history is empty: run at least one aiw_round before plotting")
    fig = Figure(figsize=(8, 6.5))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1)
    _stack(ax1, *_table(history, "type_counts"), "failure types (AIW analyses)", "failed episodes")
    _stack(ax2, *_table(history, "type_share"), "task-sampling probability by task type", "probability")
    ax2.set_ylim(0, 1)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
