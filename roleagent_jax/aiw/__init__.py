"""Agent-In-World (AIW): failure analysis, failure memory, retrieval and failure-driven task sampling.

Generic over scenario families: the taxonomy, heuristic analyser and goal patterns come from the
family (`envs.base.Family`). `plot_aiw_history` loads on first use: importing AIW (or a family)
does not import matplotlib.
"""

from typing import Any

from roleagent_jax.aiw.loop import (
    AIWState,
    aiw_round,
    analyse_failures,
    analysis_request,
    choice_request,
    format_round,
    policy_round,
    record_round,
)
from roleagent_jax.aiw.memory import FailureMemory, trajectory_digest
from roleagent_jax.aiw.report_parser import ANALYSIS_STOP, build_analysis_prompt, parse_failure_report
from roleagent_jax.aiw.retrieval import (
    TaskIndex,
    build_choice_prompt,
    parse_choice,
    retrieve,
    retrieve_many,
    retrieve_with_sources,
)
from roleagent_jax.aiw.task_sampler import TaskSampler, apply_cap
from roleagent_jax.aiw.taxonomy import normalize_failure_type, taxonomy
from roleagent_jax.types import UNKNOWN, FailureReport

__all__ = [
    "ANALYSIS_STOP", "UNKNOWN", "AIWState", "FailureMemory", "FailureReport", "TaskIndex", "TaskSampler",
    "aiw_round", "analyse_failures", "analysis_request", "apply_cap", "build_analysis_prompt",
    "build_choice_prompt", "choice_request", "format_round", "policy_round", "record_round", "normalize_failure_type", "parse_choice", "parse_failure_report",
    "plot_aiw_history", "retrieve", "retrieve_many", "retrieve_with_sources", "taxonomy", "trajectory_digest",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The plotting entry point, imported on first use so that matplotlib loads only where AIW plots."""
    if name == "plot_aiw_history":
        from roleagent_jax.aiw.plots import plot_aiw_history

        return plot_aiw_history
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
