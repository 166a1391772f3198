"""Agent-In-World (AIW): failure analysis, failure memory, retrieval and failure-driven task sampling.

Generic over scenario families: the taxonomy, heuristic analyser and goal patterns come from the
family (`envs.base.Family`).
"""

from roleagent_jax.aiw.loop import AIWState, aiw_round, analyse_failures, analysis_request, format_round
from roleagent_jax.aiw.memory import FailureMemory, trajectory_digest
from roleagent_jax.aiw.plots import plot_aiw_history
from roleagent_jax.aiw.report_parser import ANALYSIS_STOP, build_analysis_prompt, parse_failure_report
from roleagent_jax.aiw.retrieval import TaskIndex, build_choice_prompt, parse_choice, retrieve, retrieve_many
from roleagent_jax.aiw.task_sampler import TaskSampler, apply_cap
from roleagent_jax.aiw.taxonomy import UNKNOWN, FailureReport, normalize_failure_type, taxonomy

__all__ = [
    "ANALYSIS_STOP", "UNKNOWN", "AIWState", "FailureMemory", "FailureReport", "TaskIndex", "TaskSampler",
    "aiw_round", "analyse_failures", "analysis_request", "apply_cap", "build_analysis_prompt",
    "build_choice_prompt", "format_round", "normalize_failure_type", "parse_choice", "parse_failure_report",
    "plot_aiw_history", "retrieve", "retrieve_many", "taxonomy", "trajectory_digest",
]  # fmt: skip
