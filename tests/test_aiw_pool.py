"""AIW pool test: a scripted agent always fails one task type; its sampled share must rise, capped.

Also holds the synthetic ALFWorld-like pool (goals in ALFWorld's own sentence templates) other AIW tests use.
"""

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from roleagent_jax.aiw import (
    AIWState,
    FailureMemory,
    TaskSampler,
    aiw_round,
    format_round,
    plot_aiw_history,
)
from roleagent_jax.envs import get_family
from roleagent_jax.envs.alfworld.goals import parse_goal
from roleagent_jax.envs.alfworld.heuristic import analyse
from roleagent_jax.types import Step, Trajectory

ALFWORLD = get_family("alfworld")

OBJECTS = ["apple", "tomato", "potato", "egg", "bread", "lettuce", "mug", "plate", "cup", "bowl"]
RECEPS = [
    "fridge",
    "countertop",
    "diningtable",
    "cabinet",
    "shelf",
    "sidetable",
    "drawer",
    "garbagecan",
    "desk",
    "dresser",
]
TEMPLATES = {
    "pick_and_place_simple": ["put a {o} in {r}.", "put some {o} on {r}."],
    "look_at_obj_in_light": ["look at {o} under the desklamp.", "examine the {o} with the desklamp."],
    "pick_clean_then_place_in_recep": ["put a clean {o} in {r}.", "clean some {o} and put it in {r}."],
    "pick_heat_then_place_in_recep": ["put a hot {o} in {r}.", "heat some {o} and put it in {r}."],
    "pick_cool_then_place_in_recep": ["put a cool {o} in {r}.", "cool some {o} and put it in {r}."],
    "pick_two_obj_and_place": ["put two {o} in {r}.", "find two {o} and put them in {r}."],
}
TYPES = list(TEMPLATES)


@dataclass
class Pool:
    goals: list[str] = field(default_factory=list)
    task_types: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.goals)


def make_pool(per_type: int = 10) -> Pool:
    pool = Pool()
    for k, tt in enumerate(TYPES):
        for i in range(per_type):
            tmpl = TEMPLATES[tt][i % 2]
            pool.goals.append(
                tmpl.format(o=OBJECTS[(i + k) % len(OBJECTS)], r=RECEPS[(3 * i + k) % len(RECEPS)])
            )
            pool.task_types.append(tt)
    return pool


def failed_episode(task_id: int, task_type: str, goal: str, variant: int = 0) -> Trajectory:
    """A scripted failure: wander, take the object, and place it without the required step (or loop)."""
    spec = parse_goal(goal, task_type)
    obj = spec.obj or "thing"
    script = [
        (
            "go to countertop 1",
            f"You arrive at countertop 1. On the countertop 1, you see a {obj} 1.",
        )
    ]
    script.append((f"take {obj} 1 from countertop 1", f"You pick up the {obj} 1 from the countertop 1."))
    if variant % 2 == 0:
        recep = spec.recep or "shelf"
        script += [
            (f"go to {recep} 1", f"You arrive at {recep} 1."),
            (f"move {obj} 1 to {recep} 1", f"You move the {obj} 1 to the {recep} 1."),
        ]
    else:
        script += [("go to bed 1", "You arrive at bed 1."), ("go to desk 1", "You arrive at desk 1.")] * 3
    steps, obs = [], "You are in the middle of a room."
    for action, nxt in script:
        steps.append(Step(obs, [], f"<action>{action}</action>", action, True, 0.0, nxt))
        obs = nxt
    return Trajectory(task_id=task_id, task_type=task_type, goal=goal, steps=steps)


# ----------------------------------------------------------------------------- the pool test


class Cfg:
    analyser = "heuristic"
    retrieval = "fuzzy"
    top_k = 3
    min_sim = 0.0
    self_boost = 1.0
    aggregate = "max"
    eta = 1.0
    decay = 0.9
    temperature = 1.0
    epsilon = 0.2
    cap = 0.05
    unlearnable_weight = 1.0  # unweighed boosts: these tests pin the plain boosting rule
    seed = 0


def run_rounds(tmp_path, failing_type: str, rounds: int, batch: int = 16, cfg=Cfg):
    pool = make_pool()
    sampler = TaskSampler(
        len(pool),
        eta=cfg.eta,
        decay=cfg.decay,
        temperature=cfg.temperature,
        epsilon=cfg.epsilon,
        cap=cfg.cap,
        seed=cfg.seed,
    )
    state = AIWState(sampler, FailureMemory(tmp_path / "failures.jsonl"))
    base = sum(t == failing_type for t in pool.task_types) / len(pool)
    for it in range(rounds):
        tasks = sampler.sample(batch)
        failed = [
            failed_episode(int(t), pool.task_types[t], pool.goals[t], variant=it + j)
            for j, t in enumerate(tasks)
            if pool.task_types[t] == failing_type
        ]
        reports = [analyse(t) for t in failed]
        metrics = aiw_round(state, failed, reports, pool, ALFWORLD, cfg, it, seed=cfg.seed)
        assert metrics["aiw/max_prob"] <= cfg.cap + 1e-12
        assert format_round(metrics, state.history[-1]).startswith("AIW:")
    return pool, state, base


def test_always_failing_type_gains_share_and_cap_holds(tmp_path):
    failing = "pick_clean_then_place_in_recep"
    pool, state, base = run_rounds(tmp_path, failing, rounds=5)
    p = state.sampler.probs()
    mask = np.array([t == failing for t in pool.task_types])
    share = p[mask].sum()
    assert share >= 2 * base, (share, base)
    assert p.max() <= Cfg.cap + 1e-12 and p.min() >= Cfg.epsilon / len(pool) - 1e-12
    # what is actually drawn follows: sampled share of the failing type over the next draws
    draws = state.sampler.sample(20000, replace=True)
    assert mask[draws].mean() >= 2 * base
    # the boosts spread over the whole pattern (different objects), not only the tasks that failed
    boosted = np.flatnonzero(state.sampler.logits > 0)
    assert set(pool.task_types[t] for t in boosted) == {failing}
    assert len(boosted) >= 8
    # history and the memory record the rounds
    assert len(state.history) == 5 and state.history[-1]["type_share"][failing] == pytest.approx(share)
    types = state.memory.type_counts()
    assert set(types) <= {"missing_precondition", "navigation_loop"} and sum(types.values()) == len(
        state.memory
    )


def test_share_returns_to_base_when_failures_stop(tmp_path):
    failing = "pick_heat_then_place_in_recep"
    pool, state, base = run_rounds(tmp_path, failing, rounds=4)
    mask = np.array([t == failing for t in pool.task_types])
    for it in range(4, 120):
        aiw_round(state, [], [], pool, ALFWORLD, Cfg, it, seed=Cfg.seed)
    assert state.sampler.probs()[mask].sum() == pytest.approx(base, abs=1e-3)


def test_aiw_state_round_trip(tmp_path):
    pool, state, _ = run_rounds(tmp_path, "pick_cool_then_place_in_recep", rounds=3)
    ckpt = json.loads(json.dumps(state.state_dict()))
    expected_probs = state.sampler.probs()
    expected_draw = state.sampler.sample(8).tolist()
    # the run goes on past the checkpoint, then "crashes"
    run_state = state
    aiw_round(
        run_state,
        [failed_episode(0, pool.task_types[0], pool.goals[0])],
        [analyse(failed_episode(0, pool.task_types[0], pool.goals[0]))],
        pool,
        ALFWORLD,
        Cfg,
        3,
        seed=Cfg.seed,
    )
    fresh = AIWState(TaskSampler(len(pool), seed=99), FailureMemory(tmp_path / "failures.jsonl"))
    fresh.load_state_dict(ckpt)
    np.testing.assert_array_equal(fresh.sampler.probs(), expected_probs)
    assert fresh.sampler.sample(8).tolist() == expected_draw
    assert len(fresh.memory) == ckpt["memory"]["n_records"] and fresh.history == ckpt["history"]
    lines = AIWState(fresh.sampler, fresh.memory, index=state.index).top_boosted(3)
    assert len(lines) == 3 and "cool" in lines[0]


def test_plot_written(tmp_path):
    _, state, _ = run_rounds(tmp_path, "pick_two_obj_and_place", rounds=3)
    out = plot_aiw_history(state.history, tmp_path / "report" / "aiw.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError):
        plot_aiw_history([], tmp_path / "x.png")


def test_round_input_errors(tmp_path):
    pool = make_pool()
    state = AIWState(TaskSampler(len(pool)), FailureMemory(tmp_path / "m.jsonl"))
    with pytest.raises(ValueError, match="reports for"):
        aiw_round(
            state,
            [failed_episode(0, pool.task_types[0], pool.goals[0])],
            [],
            pool,
            ALFWORLD,
            Cfg,
            0,
            seed=Cfg.seed,
        )
    small = AIWState(TaskSampler(5), FailureMemory(tmp_path / "n.jsonl"))
    with pytest.raises(ValueError, match="sampler"):
        aiw_round(small, [], [], pool, ALFWORLD, Cfg, 0, seed=Cfg.seed)


def test_real_valid_seen_pool(alfworld_data, tmp_path):
    pool = ALFWORLD.task_pool("valid_seen", data_dir=alfworld_data)
    for goal, tt in zip(pool.goals, pool.task_types):  # every real goal parses into the pieces AIW uses
        spec = parse_goal(goal, tt)
        assert spec.obj and (spec.recep or spec.look), goal
    failing = "pick_heat_then_place_in_recep"
    sampler = TaskSampler(len(pool), eta=Cfg.eta, decay=Cfg.decay, epsilon=Cfg.epsilon, cap=Cfg.cap, seed=0)
    state = AIWState(sampler, FailureMemory(tmp_path / "failures.jsonl"))
    mask = np.array([t == failing for t in pool.task_types])
    for it in range(5):
        tasks = sampler.sample(16)
        failed = [failed_episode(int(t), failing, pool.goals[t], variant=it) for t in tasks if mask[t]]
        aiw_round(state, failed, [analyse(t) for t in failed], pool, ALFWORLD, Cfg, it, seed=Cfg.seed)
    p = sampler.probs()
    assert p[mask].sum() >= 2 * mask.mean() and p.max() <= Cfg.cap + 1e-12


def test_round_reports_the_models_own_analyses_and_choices(tmp_path):
    """With the policy as analyst and chooser, the metrics tell its parsed answers from the stand-ins."""
    from roleagent_jax.aiw import analyse_failures

    pool = make_pool()
    failed = [failed_episode(t, pool.task_types[t], pool.goals[t]) for t in (0, 1, 2, 3)]
    texts = [
        "FAILURE_TYPE: wrong_object\nQUERY: clean the object at the sinkbasin",
        "I am not sure what happened.",
        "",
        "FAILURE_TYPE: wrong_object\nLESSON: take the right object first",
    ]
    reports = analyse_failures(failed, ALFWORLD, texts)
    sources = [r.source for r in reports]
    assert "llm" in sources and "heuristic" in sources  # some parsed, some replaced by the heuristic

    class LLMCfg(Cfg):
        analyser = "llm"
        retrieval = "llm"

    state = AIWState(TaskSampler(len(pool), seed=0), FailureMemory(tmp_path / "m.jsonl"))
    prompts_seen = []

    def choose(prompts):
        prompts_seen.extend(prompts)
        return ["CHOICE: 1", "nothing", "CHOICE: 2", "?"][: len(prompts)]

    m = aiw_round(state, failed, reports, pool, ALFWORLD, LLMCfg, 0, seed=0, choose_fn=choose)
    assert len(prompts_seen) == 4
    assert m["aiw/analyst_parsed_rate"] == sources.count("llm") / 4
    assert m["aiw/analyst_parsed_rate"] + m["aiw/analyst_fallback_rate"] == 1.0
    assert (m["aiw/choice_llm_rate"], m["aiw/choice_fallback_rate"]) == (0.5, 0.5)
    quiet = aiw_round(state, failed, reports, pool, ALFWORLD, Cfg, 1, seed=0)  # heuristic + fuzzy
    assert not any(k.startswith(("aiw/analyst_", "aiw/choice_")) for k in quiet)


def test_policy_round_asks_the_policy_in_one_call_per_role(tmp_path):
    """With the LLM analyser and chooser the round makes one generate call for every failed episode's
    analysis and one for the choices; an answer it cannot use falls back to the family's heuristic."""
    from roleagent_jax.aiw import policy_round
    from roleagent_jax.sampling import SampleResult

    class LLMCfg(Cfg):
        analyser, retrieval, max_tokens = "llm", "llm", 64

    pool = make_pool(per_type=2)
    played = [failed_episode(t, pool.task_types[t], pool.goals[t], variant=t) for t in (0, 4, 8)]
    played.append(failed_episode(1, pool.task_types[1], pool.goals[1]))
    played[-1].won = True
    calls = []

    def generate(requests):
        calls.append([r.role for r in requests])
        return [SampleResult([1], [0.0], "no idea", "stop", r.role) for r in requests]

    state = AIWState(TaskSampler(len(pool), seed=0), FailureMemory(tmp_path / "failures.jsonl"))
    metrics = policy_round(state, played, pool, ALFWORLD, LLMCfg, 0, seed=0, generate=generate,
                           encode=lambda text: [len(text)], max_steps=50)  # fmt: skip
    assert calls[0] == ["analyst"] * 3  # the won episode is not analysed
    assert all(roles and set(roles) <= {"chooser"} for roles in calls[1:])
    assert len(state.memory) == 3 and metrics["aiw/n_failed"] == 3
    heuristic = [analyse(t).failure_type for t in played[:3]]
    assert [r["failure_type"] for r in state.memory.records] == heuristic  # unusable answers fell back
