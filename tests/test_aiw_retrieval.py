"""Retrieval by failure pattern: fuzzy, embedding (caller's embed_fn) and LLM choice modes."""

import numpy as np
import pytest
from test_aiw_pool import TYPES, failed_episode, make_pool

from roleagent_jax.aiw import FailureMemory
from roleagent_jax.aiw.retrieval import (
    TaskIndex,
    build_choice_prompt,
    parse_choice,
    pattern_similarity,
    retrieve,
    retrieve_many,
    retrieve_with_sources,
)
from roleagent_jax.envs import get_family
from roleagent_jax.envs.alfworld.heuristic import analyse
from roleagent_jax.types import FailureReport

ALFWORLD = get_family("alfworld")

POOL = make_pool()
CLEAN = "pick_clean_then_place_in_recep"


def clean_report():
    t = next(i for i, tt in enumerate(POOL.task_types) if tt == CLEAN)
    traj = failed_episode(t, CLEAN, POOL.goals[t])
    return t, analyse(traj)


def test_fuzzy_retrieves_the_pattern_not_the_object():
    t, rep = clean_report()
    hits = retrieve(rep, POOL, ALFWORLD, None, "fuzzy", k=5, exclude=[t])
    assert len(hits) == 5
    assert all(POOL.task_types[i] == CLEAN and i != t for i, _ in hits)
    assert all(0.0 <= s <= 1.0 for _, s in hits)
    objs = {POOL.goals[i].split()[2] for i, _ in hits}
    assert len(objs) > 1  # different surface objects
    # k larger than the pattern: only tasks that match at all are returned
    assert len(retrieve(rep, POOL, ALFWORLD, None, "fuzzy", k=50, exclude=[t])) == 9


@pytest.mark.parametrize(
    "query,expected",
    [
        ("heated egg placed in the wrong receptacle", "pick_heat_then_place_in_recep"),
        ("forgot to turn on the desklamp", "look_at_obj_in_light"),
        ("needed both objects but brought one", "pick_two_obj_and_place"),
        ("should wash the mug at the sink first", CLEAN),
        ("chill the plate before placing", "pick_cool_then_place_in_recep"),
        ("pick and place: gave up early", "pick_and_place_simple"),
        ("clen then plase: loop", CLEAN),  # typos
    ],
)
def test_paraphrased_queries_find_their_pattern(query, expected):
    sims = {tt: pattern_similarity(query, tt, ALFWORLD) for tt in TYPES}
    assert max(sims, key=sims.get) == expected
    assert sorted(sims.values())[-2] == 0.0  # nothing else matches
    hits = retrieve(FailureReport("wrong_receptacle", query=query), POOL, ALFWORLD, k=4)
    assert {POOL.task_types[i] for i, _ in hits} == {expected}


def test_falls_back_to_lesson_then_own_type():
    rep = FailureReport(
        "navigation_loop", query="the agent walked in circles", lesson="heat it with the microwave first"
    )
    assert {POOL.task_types[i] for i, _ in retrieve(rep, POOL, ALFWORLD, k=3)} == {
        "pick_heat_then_place_in_recep"
    }
    vague = FailureReport("navigation_loop", query="bad", lesson="do better")
    hits = retrieve(vague, POOL, ALFWORLD, k=3, task_type="pick_two_obj_and_place")
    assert {POOL.task_types[i] for i, _ in hits} == {"pick_two_obj_and_place"}
    assert retrieve(vague, POOL, ALFWORLD, k=3) == []


def test_memory_pulls_tasks_that_failed_the_same_way(tmp_path):
    mem = FailureMemory(tmp_path / "m.jsonl")
    look_task = POOL.task_types.index("look_at_obj_in_light")
    past = FailureReport("navigation_loop", query="walked between bed and desk in circles")
    mem.add(0, failed_episode(look_task, POOL.task_types[look_task], POOL.goals[look_task]), past)
    rep = FailureReport("navigation_loop", query="walked between bed and desk in circles again")
    hits = dict(retrieve(rep, POOL, ALFWORLD, mem, k=3))
    assert look_task in hits and 0.6 <= hits[look_task] <= 0.8
    # a different failure type does not match the memory record
    assert retrieve(FailureReport("wrong_receptacle", query=rep.query), POOL, ALFWORLD, mem, k=3) == []


def test_ties_are_broken_by_seed():
    _, rep = clean_report()
    a = retrieve(rep, POOL, ALFWORLD, k=3, seed=1)
    assert a == retrieve(rep, POOL, ALFWORLD, k=3, seed=1)
    picks = {tuple(i for i, _ in retrieve(rep, POOL, ALFWORLD, k=3, seed=s)) for s in range(6)}
    assert len(picks) > 1


def bag_embed(texts):
    """A deterministic caller-side embedding: counts of pattern words (stands in for pooled hidden states)."""
    vocab = [
        "clean",
        "heat",
        "cool",
        "desklamp",
        "two",
        "pick",
        "sinkbasin",
        "microwave",
        "fridge",
        "both",
        "place",
    ]
    return np.array([[t.lower().count(w) for w in vocab] for t in texts], np.float64)


def test_embedding_mode_uses_cosine_of_caller_embeddings():
    _, rep = clean_report()
    hits = retrieve(rep, POOL, ALFWORLD, mode="embedding", k=4, embed_fn=bag_embed)
    assert {POOL.task_types[i] for i, _ in hits} == {CLEAN}
    assert all(0 < s <= 1 for _, s in hits)
    with pytest.raises(ValueError, match="embed_fn"):
        retrieve(rep, POOL, ALFWORLD, mode="embedding")
    with pytest.raises(ValueError, match="shape"):
        retrieve(rep, POOL, ALFWORLD, mode="embedding", embed_fn=lambda texts: np.ones((2, 3)))


def test_llm_mode_parses_choices_and_falls_back():
    _, rep = clean_report()
    prompts_seen = []

    def choose(prompts):
        prompts_seen.extend(prompts)
        return ["CHOICE: 2, 1, 2, 99", "no idea"]

    out = retrieve_many(
        [rep, rep], POOL, ALFWORLD, mode="llm", k=2, choose_fn=choose, task_types=[CLEAN, CLEAN]
    )
    assert len(prompts_seen) == 2 and "Candidates:" in prompts_seen[0]
    cands = retrieve_many([rep], POOL, ALFWORLD, mode="fuzzy", k=8)[0]
    assert [t for t, _ in out[0]] == [cands[1][0], cands[0][0]]
    assert all(s >= 0.5 for _, s in out[0])
    assert len(out[1]) == 2 and all(POOL.task_types[t] == CLEAN for t, _ in out[1])  # fuzzy fallback
    with pytest.raises(ValueError, match="choose_fn"):
        retrieve(rep, POOL, ALFWORLD, mode="llm")
    again, sources = retrieve_with_sources(
        [rep, rep], POOL, ALFWORLD, mode="llm", k=2, choose_fn=choose, task_types=[CLEAN, CLEAN]
    )
    assert again == out and sources == ["llm", "fallback"]  # the model's pick vs the fuzzy stand-in
    assert retrieve_with_sources([rep], POOL, ALFWORLD, mode="fuzzy")[1] == ["fuzzy"]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("CHOICE: 3, 1", [2, 0]),
        ("choices = 1 2 3", [0, 1]),
        ("I pick 4 and 2.", [3, 1]),
        ("CHOICE: none", []),
        ("", []),
        (None, []),
        ("CHOICE: 0, 5, 5, 1", [4, 0]),
        ("x" * 100000, []),
    ],
)
def test_parse_choice(text, expected):
    assert parse_choice(text, n_candidates=5, k=2) == expected


def test_choice_prompt_and_index():
    idx = TaskIndex.build(POOL, ALFWORLD)
    assert len(idx) == 60 and idx.types == sorted(TYPES)
    p = build_choice_prompt(FailureReport("wrong_receptacle", query="q"), idx, [0, 1], 2)
    assert "1. " + POOL.goals[0] in p and "CHOICE" in p
    assert "X" in idx.description(0)
    with pytest.raises(ValueError):
        TaskIndex.build(type("P", (), {"goals": ["a"], "task_types": []})(), ALFWORLD)
    with pytest.raises(ValueError):
        retrieve(FailureReport(), POOL, ALFWORLD, mode="bm25")


def test_llm_mode_offers_candidates_even_without_fuzzy_matches():
    vague = FailureReport("navigation_loop", query="bad", lesson="do better")
    seen = []

    def choose(prompts):
        seen.extend(prompts)
        return ["CHOICE: 1"]

    hits = retrieve(vague, POOL, ALFWORLD, mode="llm", k=2, choose_fn=choose)
    assert seen[0].count("\n") >= 8  # 8 candidates listed
    assert len(hits) == 1 and hits[0][1] == 0.5
    assert retrieve(vague, POOL, ALFWORLD, mode="llm", k=2, choose_fn=lambda p: ["no"]) == []
