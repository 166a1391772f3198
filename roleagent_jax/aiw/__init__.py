"""Agent-In-World (AIW): failure analysis, failure memory, retrieval and failure-driven task sampling."""

from roleagent_jax.aiw.heuristic import RULE_ORDER, heuristic_analyse
from roleagent_jax.aiw.loop import AIWState, aiw_round, analyse_failures, analysis_request, format_round
from roleagent_jax.aiw.memory import FailureMemory, trajectory_digest
from roleagent_jax.aiw.patterns import GoalSpec, abstract_goal, parse_goal, pattern_name, pattern_text
from roleagent_jax.aiw.plots import plot_aiw_history
from roleagent_jax.aiw.report_parser import ANALYSIS_STOP, build_analysis_prompt, parse_failure_report
from roleagent_jax.aiw.retrieval import TaskIndex, build_choice_prompt, parse_choice, retrieve, retrieve_many
from roleagent_jax.aiw.task_sampler import TaskSampler, apply_cap
from roleagent_jax.aiw.taxonomy import TAXONOMY, UNKNOWN, FailureReport, normalize_failure_type

__all__ = [
    "ANALYSIS_STOP", "RULE_ORDER", "TAXONOMY", "UNKNOWN", "AIWState", "FailureMemory", "FailureReport",
    "GoalSpec", "TaskIndex", "TaskSampler", "abstract_goal", "aiw_round", "analyse_failures",
    "analysis_request", "apply_cap", "build_analysis_prompt", "build_choice_prompt", "format_round",
    "heuristic_analyse", "normalize_failure_type", "parse_choice", "parse_failure_report", "parse_goal",
    "pattern_name", "pattern_text", "plot_aiw_history", "retrieve", "retrieve_many", "trajectory_digest",
]  # fmt: skip
