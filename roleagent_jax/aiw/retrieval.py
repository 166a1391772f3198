"""Retrieval: which tasks of the pool are likely to fail the way an analysed failure did.

Matching is by task *pattern* (the family's: ALFWorld's clean-then-place, heat-then-place, ...), never
by the surface entities, so a failure on "put a clean apple in fridge" pulls every clean-then-place task
whatever its object.

- ``fuzzy``: the report's query (then its lesson, then the failed task's own type) is matched with
  rapidfuzz against the distinctive keywords of each pattern (``Family.pattern_keywords``, e.g.
  ``clean``/``sinkbasin``, ``heat``/``microwave``...; a query word counts when it starts with the keyword or, both being 4+ letters,
  has rapidfuzz ratio >= ``KEYWORD_MIN`` to it). Pattern similarity = best keyword score / 100 (0 below the threshold). Past reports in the
  memory with the same failure type and a similar query (token-set ratio >= ``MEMORY_MIN``) add their
  tasks with ``MEMORY_WEIGHT`` x that ratio. A task's similarity is the max of the two.
- ``embedding``: cosine similarity (negative values clipped to 0) between caller-supplied embeddings
  (``embed_fn(texts) -> [n, d]``, e.g. pooled hidden states of the policy) of the query + lesson and
  of each task's pattern description plus placeholder goal; max'ed with the memory term above.
- ``llm``: the best fuzzy candidates (``candidates_per_pick * k``, topped up with random others when
  fewer match) are listed in a prompt and the caller's
  ``choose_fn(prompts) -> texts`` (one batched sampler call) picks; chosen tasks keep
  ``max(fuzzy similarity, LLM_MIN_SIM)``; an unusable answer falls back to the fuzzy top k.

Ties (all tasks of a pattern score alike) are broken by a seeded shuffle, so top-k spreads over the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from rapidfuzz import fuzz, utils

from roleagent_jax.aiw.memory import FailureMemory
from roleagent_jax.types import UNKNOWN, FailureReport

if TYPE_CHECKING:
    from roleagent_jax.envs.base import Family

MODES = ("fuzzy", "embedding", "llm")
KEYWORD_MIN = 80.0
MEMORY_MIN = 80.0
MEMORY_WEIGHT = 0.8
MEMORY_SCAN = 2000  # only the most recent records are compared (bounded cost per round)
LLM_MIN_SIM = 0.5


@dataclass
class TaskIndex:
    """The pool seen at pattern level (through its family): distinct task types and each task's type index."""

    goals: list[str]
    task_types: list[str]
    types: list[str]  # distinct task types, sorted
    type_index: np.ndarray  # int [N]: task -> index into ``types``
    family: Family

    @classmethod
    def build(cls, pool, family: Family | None = None) -> TaskIndex:
        """From anything with ``goals`` and ``task_types`` (e.g. ``envs.TaskPool``) and its family, or a
        TaskIndex (returned as it is)."""
        if isinstance(pool, TaskIndex):
            return pool
        if family is None:
            raise ValueError("TaskIndex.build needs the pool's family")
        goals, types = list(pool.goals), list(pool.task_types)
        if len(goals) != len(types) or not goals:
            raise ValueError(
                f"task pool needs equal, non-empty goals/task_types, got {len(goals)}/{len(types)}"
            )
        distinct = sorted(set(types))
        pos = {t: i for i, t in enumerate(distinct)}
        return cls(goals, types, distinct, np.array([pos[t] for t in types], np.int64), family)

    def __len__(self) -> int:
        return len(self.goals)

    def description(self, task: int) -> str:
        tt = self.task_types[task]
        return f"{self.family.pattern_text(tt)} | {self.family.abstract_goal(self.goals[task], tt)}"


def _keyword_score(keyword: str, text: str, words: list[str]) -> float:
    if " " in keyword:
        return fuzz.partial_ratio(keyword, text)
    best = 0.0
    for w in words:
        if w.startswith(keyword):
            return 100.0
        if len(keyword) >= 4 and len(w) >= 4:  # short words: typo tolerance would match "to" to "two"
            best = max(best, fuzz.ratio(keyword, w))
    return best


def pattern_similarity(text: str, task_type: str, family: Family) -> float:
    """How strongly ``text`` names the pattern of ``task_type``, in [0, 1] (0 below KEYWORD_MIN)."""
    norm = utils.default_process(text or "")
    words = norm.split()
    keys = family.pattern_keywords.get(task_type, (family.pattern_name(task_type),))
    score = max((_keyword_score(k, norm, words) for k in keys), default=0.0)
    return score / 100.0 if score >= KEYWORD_MIN else 0.0


def _type_sims(report: FailureReport, index: TaskIndex, task_type: str | None) -> np.ndarray:
    """Similarity of the report to each distinct task type: query, else lesson, else the failed task's type."""
    for text in (report.query, report.lesson):
        sims = np.array([pattern_similarity(text, t, index.family) for t in index.types])
        if sims.max(initial=0.0) > 0:
            return sims
    return np.array([1.0 if t == task_type else 0.0 for t in index.types])


def _memory_sims(report: FailureReport, memory: FailureMemory | None, n: int) -> np.ndarray:
    out = np.zeros(n)
    if memory is None or report.failure_type == UNKNOWN or not report.query:
        return out
    q = utils.default_process(report.query)
    for rec in memory.records[-MEMORY_SCAN:]:
        t = rec.get("task_id")
        if rec.get("failure_type") != report.failure_type or not isinstance(t, int) or not 0 <= t < n:
            continue
        r = fuzz.token_set_ratio(q, utils.default_process(rec.get("query", "")))
        if r >= MEMORY_MIN:
            out[t] = max(out[t], MEMORY_WEIGHT * r / 100.0)
    return out


def fuzzy_scores(
    report: FailureReport, index: TaskIndex, memory: FailureMemory | None = None, task_type: str | None = None
) -> np.ndarray:
    """Fuzzy similarity of the report to every task: float [N] in [0, 1]."""
    by_type = _type_sims(report, index, task_type)[index.type_index]
    return np.clip(np.maximum(by_type, _memory_sims(report, memory, len(index))), 0.0, 1.0)


def _top_k(
    sims: np.ndarray,
    k: int,
    min_sim: float,
    exclude: set[int],
    rng: np.random.Generator,
    keep_zero: bool = False,
) -> list:
    order = rng.permutation(len(sims))  # random tie-break: equal scores spread over the pattern
    order = order[np.argsort(-sims[order], kind="stable")]
    out = []
    for t in order:
        if len(out) >= k or sims[t] < min_sim:
            break
        if int(t) not in exclude and (sims[t] > 0 or keep_zero):
            out.append((int(t), float(sims[t])))
    return out


def build_choice_prompt(report: FailureReport, index: TaskIndex, candidates: Sequence[int], k: int) -> str:
    """Ask the policy which candidate tasks could fail the same way (answer: ``CHOICE: 2, 5``)."""
    lines = [
        "A task failed. Pick the tasks below most likely to fail in the same way.",
        f"Failure: {report.failure_type}. {report.detail[:160]}",
        f"Pattern: {report.query[:160]}",
        "Candidates:",
    ]
    lines += [
        f"{i}. {index.goals[t]} ({index.family.pattern_name(index.task_types[t])})"
        for i, t in enumerate(candidates, 1)
    ]
    lines.append(f"Answer with up to {k} candidate numbers, as: CHOICE: <numbers separated by commas>")
    return "\n".join(lines) + "\n"


def parse_choice(text: str, n_candidates: int, k: int) -> list[int]:
    """0-based candidate positions from an answer; the CHOICE line if present, else any numbers. Never raises."""
    if not isinstance(text, str):
        return []
    text = text[:5000]
    m = re.search(r"choice[s]?\s*[:：=]\s*(.*)", text, re.IGNORECASE)
    nums = re.findall(r"\d{1,4}", m.group(1) if m else text)
    out: list[int] = []
    for s in nums:
        i = int(s) - 1
        if 0 <= i < n_candidates and i not in out:
            out.append(i)
        if len(out) >= k:
            break
    return out


def retrieve_many(reports: Sequence[FailureReport], *args, **kw) -> list[list[tuple[int, float]]]:
    """Top-k (task id, similarity in [0, 1]) per report, best first (``retrieve_with_sources`` without
    the sources)."""
    return retrieve_with_sources(reports, *args, **kw)[0]


def retrieve_with_sources(
    reports: Sequence[FailureReport],
    pool,
    family: Family | None = None,
    memory: FailureMemory | None = None,
    mode: str = "fuzzy",
    k: int = 3,
    *,
    task_types: Sequence[str | None] | None = None,
    exclude: Sequence[Sequence[int]] | None = None,
    min_sim: float = 0.0,
    embed_fn: Callable[[list[str]], np.ndarray] | None = None,
    choose_fn: Callable[[list[str]], list[str]] | None = None,
    candidates_per_pick: int = 4,
    seed: int = 0,
) -> tuple[list[list[tuple[int, float]]], list[str]]:
    """Top-k (task id, similarity in [0, 1]) per report, best first, and where each report's choice came
    from: the mode's name, or for ``llm`` "llm" (a parsed answer) or "fallback" (the fuzzy top k stood in
    for an unusable answer). Batches the embedding / LLM calls.

    ``pool`` is a task pool of ``family`` or a ``TaskIndex`` (which knows its family)."""
    if mode not in MODES:
        raise ValueError(f"retrieval mode must be one of {MODES}, got {mode!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    index = TaskIndex.build(pool, family)
    n = len(reports)
    task_types = list(task_types) if task_types is not None else [None] * n
    excl = [set(map(int, e)) for e in exclude] if exclude is not None else [set() for _ in range(n)]
    rngs = [np.random.default_rng([seed, i]) for i in range(n)]
    if mode == "embedding":
        if embed_fn is None:
            raise ValueError("retrieval mode 'embedding' needs embed_fn(texts) -> array [n, d]")
        descs = [index.description(t) for t in range(len(index))]
        uniq = sorted(set(descs))
        queries = [f"{r.query} {r.lesson}".strip() or r.failure_type for r in reports]
        emb = np.asarray(embed_fn(queries + uniq), np.float64)
        if emb.ndim != 2 or emb.shape[0] != n + len(uniq):
            raise ValueError(f"embed_fn returned shape {emb.shape}, expected ({n + len(uniq)}, d)")
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        cos = np.clip(emb[:n] @ emb[n:].T, 0.0, 1.0)[:, _positions(descs, uniq)]
        sims = [np.maximum(cos[i], _memory_sims(r, memory, len(index))) for i, r in enumerate(reports)]
        return [_top_k(sims[i], k, min_sim, excl[i], rngs[i]) for i in range(n)], [mode] * n
    scores = [fuzzy_scores(r, index, memory, tt) for r, tt in zip(reports, task_types)]
    if mode == "fuzzy":
        return [_top_k(s, k, min_sim, e, g) for s, e, g in zip(scores, excl, rngs)], [mode] * n
    if choose_fn is None:
        raise ValueError("retrieval mode 'llm' needs choose_fn(prompts) -> list of answer texts")
    cands = [
        [t for t, _ in _top_k(s, candidates_per_pick * k, 0.0, e, g, keep_zero=True)]
        for s, e, g in zip(scores, excl, rngs)
    ]
    prompts = [build_choice_prompt(r, index, c, k) for r, c in zip(reports, cands)]
    answers = list(choose_fn(prompts)) if prompts else []
    out, sources = [], []
    for s, c, ans in zip(scores, cands, answers + [""] * (n - len(answers))):
        picked = parse_choice(ans, len(c), k)
        if picked:
            out.append([(c[i], max(float(s[c[i]]), LLM_MIN_SIM)) for i in picked])
        else:
            out.append([(t, float(s[t])) for t in c[:k] if s[t] > 0 and s[t] >= min_sim])
        sources.append("llm" if picked else "fallback")
    return out, sources


def _positions(items: list[str], uniq: list[str]) -> np.ndarray:
    pos = {d: i for i, d in enumerate(uniq)}
    return np.array([pos[d] for d in items])


def retrieve(
    report: FailureReport,
    pool,
    family: Family | None = None,
    memory: FailureMemory | None = None,
    mode: str = "fuzzy",
    k: int = 3,
    **kw,
) -> list[tuple[int, float]]:
    """``retrieve_many`` for one report (``task_type=`` / ``exclude=`` as single values)."""
    task_type = kw.pop("task_type", None)
    exclude = kw.pop("exclude", ())
    return retrieve_many(
        [report], pool, family, memory, mode, k, task_types=[task_type], exclude=[exclude], **kw
    )[0]
