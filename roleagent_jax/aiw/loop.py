"""One AIW round between training iterations: record failures, retrieve similar tasks, reshape sampling.

The rollout and trainer call this; everything here is host-side and deterministic given the seed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from roleagent_jax.aiw.memory import FailureMemory
from roleagent_jax.aiw.report_parser import ANALYSIS_STOP, build_analysis_prompt, parse_failure_report
from roleagent_jax.aiw.retrieval import TaskIndex, retrieve_with_sources
from roleagent_jax.aiw.task_sampler import TaskSampler
from roleagent_jax.aiw.taxonomy import taxonomy
from roleagent_jax.types import UNKNOWN, FailureReport, Trajectory

if TYPE_CHECKING:
    from roleagent_jax.envs.base import Family

TOP_BOOSTED = 8


@dataclass
class AIWState:
    """Everything AIW carries across iterations (all of it goes into checkpoints via ``state_dict``)."""

    sampler: TaskSampler
    memory: FailureMemory
    history: list[dict] = field(default_factory=list)  # one entry per round (JSON-friendly)
    index: TaskIndex | None = None  # the pool at pattern level, built on first use

    @classmethod
    def from_config(cls, pool, config, memory: FailureMemory) -> AIWState:
        """A run's AIW state: a task sampler over `pool`'s tasks with the run's ``aiw`` settings and seed
        (the task types feed `aiw.selection`), and its failure memory."""
        sampler = TaskSampler.from_config(len(pool), config.aiw, seed=config.seed, task_types=pool.task_types)
        return cls(sampler, memory)

    def state_dict(self) -> dict:
        return {
            "sampler": self.sampler.state_dict(),
            "memory": self.memory.state_dict(),
            "history": self.history,
        }

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.memory.load_state_dict(state["memory"])
        self.history = [dict(h) for h in state["history"]]

    def resume(self, state: dict, config: Mapping) -> list[str]:
        """A checkpoint's state with the ``aiw`` section's sampler settings of the resumed run on top (the
        command line may change them); returns each change as ``"key old -> new"``."""
        self.load_state_dict(state)
        return self.sampler.configure(config)

    def top_boosted(self, n: int = 10) -> list[str]:
        """Readable lines for the tasks the sampler currently favours most."""
        p = self.sampler.probs()
        order = np.argsort(-self.sampler.logits, kind="stable")[:n]
        out = []
        for t in order:
            if self.sampler.logits[t] <= 0:
                break
            desc = f"{self.index.task_types[t]}: {self.index.goals[t]}" if self.index is not None else ""
            out.append(f"task {int(t)} logit {self.sampler.logits[t]:.2f} p={p[t]:.4f} {desc}".rstrip())
        return out


def analysis_request(
    traj: Trajectory, family: Family, encode: Callable[[str], list[int]], max_tokens: int, **prompt_kw
):
    """A sampler request for the analyst role (imported lazily: AIW itself stays free of JAX)."""
    from roleagent_jax.sampling import SampleRequest

    return SampleRequest(
        encode(build_analysis_prompt(traj, family, **prompt_kw)),
        max_tokens,
        stop=(ANALYSIS_STOP,),
        role="analyst",
    )


def choice_request(prompt: str, encode: Callable[[str], list[int]], max_tokens: int):
    """A sampler request for the chooser role: the policy picks retrieval candidates (``CHOICE: 2, 5``)."""
    from roleagent_jax.sampling import SampleRequest

    return SampleRequest(encode(prompt), max_tokens, role="chooser")


def analyse_failures(
    trajs: Sequence[Trajectory],
    family: Family,
    texts: Sequence[str] | None = None,
    max_steps: int = 50,
) -> list[FailureReport]:
    """The family's heuristic reports, or parsed LLM answers with the heuristic standing in for unusable
    ones. A replaced answer keeps its raw text on the heuristic report, so bad analyses stay inspectable.
    """
    if texts is None:
        return [family.analyse_failure(t, max_steps) for t in trajs]
    if len(texts) != len(trajs):
        raise ValueError(f"{len(texts)} analyses for {len(trajs)} trajectories")
    out = []
    for t, text in zip(trajs, texts):
        rep = parse_failure_report(text, family)
        if not rep.usable:
            raw = rep.raw
            rep = family.analyse_failure(t, max_steps)
            rep.raw = raw
        out.append(rep)
    return out


def aiw_round(
    state: AIWState,
    failed_trajs: Sequence[Trajectory],
    reports: Sequence[FailureReport],
    pool,
    family: Family,
    cfg,
    iteration: int,
    *,
    seed: int,
    choose_fn: Callable[[list[str]], list[str]] | None = None,
    played: Sequence[Trajectory] = (),
) -> dict[str, float]:
    """Add the reports to memory, retrieve similar tasks, update the sampler; returns scalar metrics.

    Boosts: each failed task gets ``cfg.self_boost``, each retrieved task its similarity; per task the
    round's boosts are combined by ``cfg.aggregate`` ("max" or "sum"). Episodes the environment broke
    (``env_failed``) are not agent failures and are skipped. ``cfg`` (the config's ``aiw`` section) fields
    read: analyser, retrieval, top_k, min_sim, self_boost, aggregate, unlearnable_weight. Each boost is
    weighed by the task's learnability (``TaskSampler.learnability`` with floor ``unlearnable_weight``;
    1.0 = unweighed; a retrieved task never played takes its failed source's weight), from the success
    rates of ``played`` (every trajectory of the round, won or not). ``seed`` (the run's) seeds the
    retrieval's tie-breaks; ``choose_fn(prompts) -> texts`` is the policy as chooser (retrieval ``llm``).
    """
    if len(failed_trajs) != len(reports):
        raise ValueError(f"{len(reports)} reports for {len(failed_trajs)} failed trajectories")
    aggregate = cfg.aggregate
    if aggregate not in ("max", "sum"):
        raise ValueError(f"aiw.aggregate must be 'max' or 'sum', got {aggregate!r}")
    if state.index is None or len(state.index) != len(pool.goals if hasattr(pool, "goals") else pool):
        state.index = TaskIndex.build(pool, family)
    index = state.index
    if len(index) != state.sampler.n_tasks:
        raise ValueError(f"pool has {len(index)} tasks but the sampler {state.sampler.n_tasks}")
    pairs = [(t, r) for t, r in zip(failed_trajs, reports) if not t.env_failed]
    state.memory.add_many([(iteration, t, r) for t, r in pairs])

    hits, sources = retrieve_with_sources(
        [r for _, r in pairs],
        index,
        family,
        state.memory,
        mode=cfg.retrieval,
        k=int(cfg.top_k),
        task_types=[t.task_type for t, _ in pairs],
        exclude=[[t.task_id] for t, _ in pairs],
        min_sim=float(cfg.min_sim),
        choose_fn=choose_fn,
        seed=int(seed) * 1_000_003 + int(iteration),
    )
    self_boost = float(cfg.self_boost)
    floor = float(cfg.unlearnable_weight)
    state.sampler.record_episodes(played)
    boosts: dict[int, float] = {}
    for (traj, _), found in zip(pairs, hits):
        source = state.sampler.learnability(traj.task_id, floor)
        for task, sim in [(traj.task_id, self_boost), *found]:
            sim *= state.sampler.learnability(task, floor, default=source)
            prev = boosts.get(task)
            boosts[task] = sim if prev is None else (max(prev, sim) if aggregate == "max" else prev + sim)
    state.sampler.update(boosts)

    counts = Counter(r.failure_type for _, r in pairs)
    probs = state.sampler.probs()
    share = state.sampler.type_shares(index.task_types)
    pool_share = {tt: c / len(index.task_types) for tt, c in Counter(index.task_types).items()}
    top = sorted(boosts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_BOOSTED]
    entropy = state.sampler.entropy()
    state.history.append(
        {
            "iteration": int(iteration),
            "type_counts": {k: int(v) for k, v in sorted(counts.items())},
            "top_boosted": [[int(t), round(float(b), 4), index.task_types[t]] for t, b in top],
            "type_share": share,
            "entropy": entropy,
        }
    )
    metrics = {f"aiw/fail/{name}": float(counts.get(name, 0)) for name in taxonomy(family)}
    metrics.update({f"aiw/share/{tt}": v for tt, v in share.items()})
    # how far AIW moved each task type from its share of the pool (what uniform sampling would give)
    metrics.update({f"aiw/shift/{tt}": v - pool_share[tt] for tt, v in share.items()})
    if pairs:
        metrics["aiw/top_type_share"] = max(counts.values()) / len(pairs)
    metrics.update(
        {
            "aiw/n_failed": float(len(pairs)),
            "aiw/n_env_failed": float(len(failed_trajs) - len(pairs)),
            "aiw/usable_rate": float(np.mean([r.usable for _, r in pairs])) if pairs else 0.0,
            "aiw/unknown_rate": counts.get(UNKNOWN, 0) / len(pairs) if pairs else 0.0,
            "aiw/n_boosted": float(len(boosts)),
            "aiw/entropy": entropy,
            "aiw/entropy_norm": entropy / math.log(len(probs)) if len(probs) > 1 else 1.0,
            "aiw/max_prob": float(probs.max()),
            "aiw/memory_records": float(len(state.memory)),
        }
    )
    if cfg.analyser == "llm" and pairs:  # the model's own answers vs the heuristic standing in for them
        own = float(np.mean([r.source == "llm" for _, r in pairs]))
        metrics.update({"aiw/analyst_parsed_rate": own, "aiw/analyst_fallback_rate": 1.0 - own})
    if cfg.retrieval == "llm" and sources:  # the model's choice vs the fuzzy top k standing in for it
        chosen = float(np.mean([s == "llm" for s in sources]))
        metrics.update({"aiw/choice_llm_rate": chosen, "aiw/choice_fallback_rate": 1.0 - chosen})
    return metrics


def record_round(sampler: TaskSampler, played: Sequence[Trajectory], task_types: Sequence[str]) -> dict:
    """A round without AIW: the outcomes still feed the sampler's per-task counts (`aiw.selection`), and
    the task types' shares are reported as an AIW round reports them."""
    sampler.record_episodes(played)
    return {f"aiw/share/{t}": p for t, p in sampler.type_shares(task_types).items()}


def policy_round(
    state: AIWState,
    played: Sequence[Trajectory],
    pool,
    family: Family,
    cfg,
    iteration: int,
    *,
    seed: int,
    generate: Callable[[list], list],
    encode: Callable[[str], list[int]],
    max_steps: int,
) -> dict[str, float]:
    """The round between two training iterations with the policy in its world roles: it analyses its
    failed episodes (``cfg.analyser == "llm"``) and chooses among the retrieval's candidates
    (``cfg.retrieval == "llm"``), each role in one batched call of `generate` (the rollout's sampler
    call); then `aiw_round`. With the heuristic analyser and fuzzy retrieval no call is made."""
    failed = [t for t in played if not t.won]
    texts = None
    if cfg.analyser == "llm" and failed:
        texts = [
            r.text for r in generate([analysis_request(t, family, encode, cfg.max_tokens) for t in failed])
        ]

    def choose(prompts: list[str]) -> list[str]:
        return [r.text for r in generate([choice_request(p, encode, cfg.max_tokens) for p in prompts])]

    reports = analyse_failures(failed, family, texts, max_steps=max_steps)
    return aiw_round(state, failed, reports, pool, family, cfg, iteration, seed=seed, played=played,
                     choose_fn=choose if cfg.retrieval == "llm" else None)  # fmt: skip


def format_round(metrics: dict[str, float], history_entry: dict | None = None) -> str:
    """One log line: failure-type histogram and the most boosted tasks of the round."""
    fails = {k.split("/", 2)[2]: int(v) for k, v in metrics.items() if k.startswith("aiw/fail/") and v}
    hist = ", ".join(f"{k}={v}" for k, v in sorted(fails.items(), key=lambda kv: -kv[1])) or "none"
    line = f"AIW: {int(metrics.get('aiw/n_failed', 0))} failures [{hist}] entropy={metrics.get('aiw/entropy', 0):.3f}"
    if history_entry and history_entry.get("top_boosted"):
        line += " top: " + ", ".join(f"#{t}({b:.2f})" for t, b, _ in history_entry["top_boosted"][:5])
    return line
