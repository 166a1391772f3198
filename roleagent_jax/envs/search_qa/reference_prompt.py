"""The reference runs' search prompt: verl-agent's `SEARCH_TEMPLATE` (and its first-turn form).

The question, how many turns were taken, the interaction history (each earlier turn's `<search>` query,
or answer, followed by what it brought back, whole) and the instruction to reason in <think>, then
either search with <search> or answer with <answer>. The text is written afresh to the same wording: a
pretrained model's published numbers were measured on it.
"""

from __future__ import annotations

from collections.abc import Sequence

_HEAD = "\nYou are an expert agent tasked with answering the given question step-by-step.\nYour question: {question}\n"
_HISTORY = (
    "\nPrior to this step, you have already taken {step_count} step(s). Below is the interaction history "
    "where <search> </search> wrapped your past search queries and <information> </information> wrapped "
    "the corresponding search results returned by the external search engine. History:\n{memory_context}\n"
)
_REPLY = (
    "\nNow it's your turn to respond for the current step.\n"
    "You should first conduct reasoning process. This process MUST be enclosed within <think> </think> "
    "tags. \nAfter completing your reasoning, choose only one of the following actions (do not perform "
    "both):\n(1) If you find you lack some knowledge, you can call a search engine to get more external "
    "information using format: <search> your query </search>.\n(2) If you have enough knowledge to answer "
    "the question confidently, provide your final answer within <answer> </answer> tags, without detailed "
    "illustrations. For example, <answer>Beijing</answer>.\n"
)


def memory_context(turns: Sequence[tuple[str, str]], step: int) -> str:
    """Each (action, result) of `turns` (already cut to the window) as `Step i:` then the action, then
    what it brought back, numbered by the turn it was taken at (1-based)."""
    first = step - len(turns) + 1
    return "\n".join(f"Step {first + j}:\n{action}\n{result}" for j, (action, result) in enumerate(turns))


def build_reference_prompt(question: str, turns: Sequence[tuple[str, str]], step: int) -> str:
    """The prompt at turn `step` (0-based) with the earlier (action, result) pairs to show."""
    head = _HEAD.format(question=question)
    if not turns:
        return head + _REPLY
    return head + _HISTORY.format(step_count=step, memory_context=memory_context(turns, step)) + _REPLY
