"""The end-of-run report: a Markdown file with PNG plots people would rather look at than read."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def binomial_se(p: float, n: int) -> float:
    """Standard error of a success rate p measured on n independent games: sqrt(p(1-p)/n)."""
    return float(np.sqrt(p * (1 - p) / n)) if n > 0 else float("nan")


def difference_se(p_before: float, n_before: int, p_after: float, n_after: int) -> float:
    """Standard error of p_after - p_before, the two rates taken as independent measurements."""
    return float(np.hypot(binomial_se(p_before, n_before), binomial_se(p_after, n_after)))


def _cell(p: float | None, se: float | None) -> str:
    if p is None:
        return "-"
    return f"{100 * p:.1f}" if se is None or np.isnan(se) else f"{100 * p:.1f} ± {100 * se:.1f}"


def rates(summary: dict) -> dict[str, float]:
    """Success per task type and overall (`all`) of an evaluation summary (`evaluation.panel.summarize`)."""
    return {**summary.get("per_type", {}), "all": summary["success"]} if summary else {}


def _games(summary: dict) -> dict[str, int]:
    return {**summary.get("count_per_type", {}), "all": summary.get("n")} if summary else {}


def paired_difference(before: dict, after: dict) -> tuple[float, float] | None:
    """Mean and standard error of after - before over the same games (`wins` of both summaries): the
    games' own difficulty cancels, so it is tighter than the two binomial errors combined."""
    b, a = before.get("wins"), after.get("wins")
    if not b or not a or len(a) != len(b):
        return None
    pairs = [(x, y) for x, y in zip(b, a, strict=True) if x is not None and y is not None]  # lost: out
    if not pairs:
        return None
    d = np.asarray([y - x for x, y in pairs], float)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")


def evaluation_rows(before: dict, after: dict) -> list[str]:
    """Markdown rows from the before/after summaries of each split: success before and after RL and the
    difference, each with its standard error (binomial; the overall difference paired over the same
    games where both summaries list them; a split without game counts shows the rates alone), then the
    family's score (mean ± its standard error) where it has one."""
    rows = []
    for split in sorted(set(before) | set(after)):
        sb, sa = before.get(split, {}), after.get(split, {})
        b, a, n = rates(sb), rates(sa), _games(sa or sb)
        for t in [k for k in sorted(set(b) | set(a)) if k != "all"] + ["all"]:
            pb, pa, nt = b.get(t), a.get(t), n.get(t)
            se_b = binomial_se(pb, nt) if pb is not None and nt else None
            se_a = binomial_se(pa, nt) if pa is not None and nt else None
            diff = "-"
            if pb is not None and pa is not None:
                se_d = difference_se(pb, nt, pa, nt) if nt else None
                paired = paired_difference(sb, sa) if t == "all" else None
                if paired is not None:
                    se_d = paired[1]
                diff = _cell(pa - pb, se_d)
                diff = diff if diff.startswith("-") else "+" + diff
            rows.append(
                f"| {split} | {t} | {nt if nt else '-'} | {_cell(pb, se_b)} | {_cell(pa, se_a)} | {diff} |"
            )
        name = (sa or sb).get("score_name")
        if name:
            cells = [_cell(x.get(name), x.get(f"{name}_se")) if x else "-" for x in (sb, sa)]
            rows.append(f"| {split} | {name} (mean) | {n.get('all', '-')} | {cells[0]} | {cells[1]} | - |")
    return rows


def _series(history: list[dict], prefix: str) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in history:
        for key, value in row.items():
            if key.startswith(prefix):
                steps, values = out.setdefault(key[len(prefix) :], ([], []))
                steps.append(row["step"])
                values.append(value)
    return out


def _plot_lines(series: dict, title: str, ylabel: str, path: Path, percent: bool = False) -> Path | None:
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (x, y) in sorted(series.items()):
        y = np.asarray(y) * (100 if percent else 1)
        ax.plot(x, y, marker="o", ms=3, lw=2.5 if name == "all" else 1.2, label=name)
    ax.set(title=title, xlabel="iteration", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_series(
    history: list[dict], evals: dict, iterations: int
) -> dict[str, tuple[list[int], list[float]]]:
    """Held-out success per split over RL: the evaluations every `eval.every` iterations, with the same
    games' rate before RL (iteration 0) and after it (the last iteration) read from the full evaluations'
    per-game `wins`, so every point of a line is the same fixed subset of games."""
    lines = {}
    for split, (steps, values) in _series(history, "eval/").items():
        if not split.endswith("/all"):
            continue
        split = split[: -len("/all")]
        n = int(next((r[f"eval/{split}/games"] for r in history if f"eval/{split}/games" in r), 0))
        points = dict(zip(steps, values, strict=True))
        for step, when in ((0, "before"), (iterations, "after")):
            wins = evals.get(when, {}).get(split, {}).get("wins")
            played = [w for w in (wins or [])[:n] if w is not None]  # the games not lost to the environment
            if n and wins and len(wins) >= n and played:
                points[step] = float(np.mean(played))
        lines[f"{split} (the first {n} games)" if n else split] = (
            sorted(points),
            [points[k] for k in sorted(points)],
        )
    return lines


def _plot_before_after(before: dict, after: dict, path: Path) -> Path | None:
    splits = sorted(set(before) & set(after))
    if not splits:
        return None
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        b, a = rates(before[split]), rates(after[split])
        types = [t for t in sorted(set(b) | set(a)) if t != "all"] + ["all"]
        x = np.arange(len(types))
        ax.bar(x - 0.2, [100 * b.get(t, 0) for t in types], 0.4, label="before RL")
        ax.bar(x + 0.2, [100 * a.get(t, 0) for t in types], 0.4, label="after RL")
        ax.set_xticks(
            x,
            [t.replace("_then_place_in_recep", "").replace("pick_", "") for t in types],
            rotation=30,
            ha="right",
            fontsize=8,
        )
        ax.set(title=split, ylabel="success %", ylim=(0, 100))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_stacked(series: dict, title: str, ylabel: str, path: Path, normalize: bool = False) -> Path | None:
    """Stacked areas per iteration; ``normalize`` shows each iteration's mix in percent of its total."""
    series = {k: v for k, v in series.items() if any(v[1])}  # types never seen would only crowd the legend
    if not series:
        return None
    names = sorted(series)
    steps = sorted({s for x, _ in series.values() for s in x})
    table = np.zeros((len(names), len(steps)))
    for i, name in enumerate(names):
        for s, v in zip(*series[name], strict=True):
            table[i, steps.index(s)] = v
    if normalize:
        table = 100 * table / np.maximum(table.sum(0, keepdims=True), 1e-12)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.stackplot(steps, table, labels=names)
    ax.set(title=title, xlabel="iteration", ylabel=ylabel)
    if normalize:
        ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def aiw_rows(history: list[dict]) -> list[str]:
    """Markdown table per AIW round: failures, the most frequent label and its share, and the task type
    whose sampling share moved furthest from the pool's share (empty when AIW never ran)."""
    rows = []
    for row in history:
        fails = {k[len("aiw/fail/") :]: v for k, v in row.items() if k.startswith("aiw/fail/") and v}
        shift = {k[len("aiw/shift/") :]: v for k, v in row.items() if k.startswith("aiw/shift/")}
        if not fails and not shift:
            continue
        total = sum(fails.values())
        top = max(sorted(fails), key=fails.get) if fails else "-"
        top_cell = f"{top} ({100 * fails[top] / total:.0f}%)" if fails else "-"
        moved = max(sorted(shift), key=lambda k: abs(shift[k])) if shift else None
        moved_cell = f"{moved} ({100 * shift[moved]:+.1f})" if moved else "-"
        rows.append(f"| {row['step']} | {int(total)} | {top_cell} | {moved_cell} |")
    if not rows:
        return []
    return [
        "## AIW per round",
        "",
        "| iteration | failures analysed | most frequent label (share) | task type moved most (points) |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


SIGNAL_KEYS = ("train/uniform_groups", "train/zero_step_groups", "update/clip_frac_low",
               "update/clip_frac_high")  # fmt: skip


def signal_series(history: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """The waste of each iteration (`rl.group_signal.signal_metrics`) beside the update's clip fractions."""
    out = {}
    for key in SIGNAL_KEYS:
        section, name = key.split("/")
        found = _series(history, f"{section}/").get(name)
        if found is not None:
            out[name] = found
    return out


def opener_rows(history: list[dict]) -> list[str]:
    """Markdown table of the policy's probability of each opener at the branch state
    (`rollout/opener_prob/<opener>/<type>`), at the first and the last iteration that logged it: whether
    the choice the branches teach moved (empty when no iteration logged it)."""
    rows = []
    for key, (steps, values) in sorted(_series(history, "rollout/opener_prob/").items()):
        opener, _, kind = key.rpartition("/")
        change = 100 * (values[-1] - values[0])
        rows.append(
            f"| {opener} | {kind} | {steps[0]}: {100 * values[0]:.1f} | {steps[-1]}: {100 * values[-1]:.1f} "
            f"| {change:+.1f} |"
        )
    if not rows:
        return []
    return [
        "## Opener probability at the branch state (%)",
        "",
        "| opener | task type | first iteration: p | last iteration: p | change (points) |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def write_report(workdir: Path, config, history: list[dict], host: dict, aiw_state=None) -> Path:
    """Write report.md and its plots into workdir/report; returns the Markdown path."""
    out = Path(workdir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    plots = {
        "Training success per task type": _plot_lines(
            _series(history, "train/success/"), "rollout success", "success %", out / "success.png", True
        ),
        "Held-out success during RL (a fixed subset of each split)": _plot_lines(
            curve_series(history, host.get("eval", {}), int(host.get("iteration", 0))),
            "held-out success on the same games over RL",
            "success %",
            out / "learning_curve.png",
            True,
        ),
        "Success per task type, before and after RL": _plot_before_after(
            host.get("eval", {}).get("before", {}),
            host.get("eval", {}).get("after", {}),
            out / "before_after.png",
        ),
        "Failure-type mix over time (AIW analyses)": _plot_stacked(
            _series(history, "aiw/fail/"),
            "share of the iteration's failed episodes by type",
            "% of failures",
            out / "failure_types.png",
            normalize=True,
        ),
        "Task-sampling share by task type, change from the pool's share (AIW)": _plot_lines(
            _series(history, "aiw/shift/"),
            "sampling share minus the pool's share (0 = uniform sampling)",
            "points",
            out / "sampling.png",
            percent=True,
        ),
        "Where the signal goes: groups without it, and the update's clipped tokens": _plot_lines(
            signal_series(history),
            "share of task groups / step groups / tokens",
            "%",
            out / "signal.png",
            percent=True,
        ),
        "Entropy of the sampled tokens (the update's)": _plot_lines(
            {k: v for k, v in _series(history, "update/").items() if k == "entropy"},
            "policy entropy at the sampled tokens",
            "nats",
            out / "entropy.png",
        ),
        "The policy's probability of each action opener at the branch state, by task type": _plot_lines(
            _series(history, "rollout/opener_prob/"),
            "p(opener | branch-state prompt), before each update",
            "probability %",
            out / "opener_prob.png",
            percent=True,
        ),
        "WIA prediction accuracy": _plot_lines(
            {k: v for k, v in _series(history, "wia/").items() if k.startswith("lms")},
            "LMS similarity of predictions",
            "LMS",
            out / "wia.png",
        ),
    }
    lines = [f"# Run report: {config.algo}", "", f"workdir: `{workdir}`", ""]
    ev = host.get("eval", {})
    if ev:
        lines += [
            "## Evaluation (success %, ± one standard error)",
            "",
            "Standard errors are binomial, sqrt(p(1-p)/n) on n games; the difference's combines both.",
            "",
            "| split | task type | games | before RL | after RL | after - before |",
            "|---|---|---|---|---|---|",
        ]
        lines += evaluation_rows(ev.get("before", {}), ev.get("after", {}))
        lines.append("")
    if host.get("sft_losses"):
        losses = host["sft_losses"]
        lines += [f"Warm start loss: {losses[0]:.3f} -> {losses[-1]:.3f}", ""]
    lines += opener_rows(history)
    lines += aiw_rows(history)
    if aiw_state is not None:
        lines += ["## Most boosted tasks (AIW)", ""]
        lines += [f"- {row}" for row in aiw_state.top_boosted()]
        lines.append("")
    for title, path in plots.items():
        if path is not None:
            lines += [f"## {title}", "", f"![{title}]({path.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report
