"""The generated knowledge base, its questions and splits, the expert and the two baselines."""

import random
import re
from collections import Counter

import pytest

from roleagent_jax.envs.search_qa import BM25Retriever, SearchQAEnv
from roleagent_jax.envs.search_qa.baselines import first_name_in, nosearch_response, random_response
from roleagent_jax.envs.search_qa.kb import FACT_PATTERNS, KBSize, fact, generate_kb, read_fact
from roleagent_jax.envs.search_qa.questions import (
    DEFAULT_MIX,
    KINDS,
    answer_of,
    generate_questions,
    held_out_entities,
)


@pytest.fixture(scope="module")
def kb():
    return generate_kb(0)


@pytest.fixture(scope="module")
def retriever(kb):
    return BM25Retriever(kb.passages())


def test_kb_is_deterministic_and_seeded(kb):
    again = generate_kb(0)
    assert [p.contents for p in again.passages()] == [p.contents for p in kb.passages()]
    assert generate_kb(1).passages()[0].contents != kb.passages()[0].contents


def test_kb_names_unique_and_relations_consistent(kb):
    passages = kb.passages()
    size = KBSize()
    assert len(passages) == size.countries + size.cities + size.people + size.works
    assert len({p.title for p in passages}) == len(passages)  # one passage per entity, no name twice
    surnames = [n.split()[-1] for n in kb.people]
    assert len(set(surnames)) == len(surnames)  # a surname points at one person
    for city in kb.cities.values():
        assert city.country in kb.countries
    for country in kb.countries.values():
        assert kb.cities[country.capital].country == country.name
    for person in kb.people.values():
        assert person.birthplace in kb.cities
        assert all(kb.works[w].creator == person.name for w in person.works)
    for work in kb.works.values():
        assert work.year > kb.people[work.creator].birth_year


def test_every_fact_reads_back_from_its_passage(kb):
    """The expert's reader recovers each relation of each entity from the passage text alone."""
    text = {p.title: p.text for p in kb.passages()}
    tables = {"capital": kb.countries, "country": kb.cities, "founded": kb.cities, "birthplace": kb.people,
              "birth_year": kb.people, "creator": kb.works, "year": kb.works}  # fmt: skip
    assert set(tables) == set(FACT_PATTERNS)
    for rel, table in tables.items():
        for name in table:
            assert read_fact(text[name], rel) == fact(kb, name, rel), (name, rel, text[name])


def test_kb_size_is_checked():
    with pytest.raises(ValueError, match="knowledge base too small"):
        KBSize(countries=5, cities=3)


def test_questions_split_kinds_and_answers(kb):
    n = 400
    test = generate_questions(kb, n, "test", seed=0)
    train = generate_questions(kb, n, "train", seed=0)
    assert [q.question for q in test] == [q.question for q in generate_questions(kb, n, "test", seed=0)]
    assert [q.question for q in generate_questions(kb, n, "test", seed=1)] != [q.question for q in test]
    counts = Counter(q.kind for q in test)
    assert counts == {k: round(n * DEFAULT_MIX[k]) for k in KINDS}
    assert len({q.question for q in test}) == n  # distinct
    held = held_out_entities(kb)
    names = sorted({*kb.countries, *kb.cities, *kb.people, *kb.works}, key=len, reverse=True)

    def named(q):
        found, text = set(), q.question
        for e in names:
            if e in text:
                found.add(e)
                text = text.replace(e, "#")
        return found

    for q in test:
        assert named(q) and named(q) <= held
    for q in train:
        assert named(q) and not named(q) & held
    assert not {q.question for q in test} & {q.question for q in train}
    for q in test + train:
        assert q.golds == (answer_of(kb, q.plan),)
        assert q.golds[0] not in q.question or q.kind == "comparison"  # the answer is only in the corpus
    comps = [q for q in test if q.kind == "comparison"]
    assert sum(first_name_in(q.question) == q.golds[0] for q in comps) == len(comps) // 2  # balanced options


def test_question_arguments(kb):
    with pytest.raises(ValueError, match="split must be one of"):
        generate_questions(kb, 5, "dev")
    with pytest.raises(ValueError, match="question mix must weigh kinds"):
        generate_questions(kb, 5, "test", mix={"trivia": 1.0})
    with pytest.raises(ValueError, match="only .* test questions of kind 'single_hop', 5000 asked"):
        generate_questions(kb, 5000, "test", mix={"single_hop": 1.0})
    only = generate_questions(kb, 10, "test", mix={"bridge3": 1.0})
    assert {q.kind for q in only} == {"bridge3"} and all(len(q.plan) == 5 for q in only)


def _play(env, tasks, respond) -> dict[str, list[float]]:
    by_kind: dict[str, list[float]] = {}
    for i, q in enumerate(tasks):
        obs, info = env.reset(q, expert=True)
        history, done = [], False
        while not done:
            action = respond(i, q, obs, info, history)
            history.append((obs, action))
            obs, _, done, info = env.step(action)
        by_kind.setdefault(q.kind, []).append(info["em"])
    return by_kind


def test_expert_and_baselines_on_200_held_out_questions(kb, retriever):
    tasks = generate_questions(kb, 200, "test", seed=0)
    env = SearchQAEnv(retriever)
    expert = _play(env, tasks, lambda i, q, obs, info, h: info["expert_plan"][0])
    rnd = _play(
        env,
        tasks,
        lambda i, q, obs, info, h: random_response(random.Random(f"0:{i}:{len(h)}"), q.question, obs),
    )
    nosearch = _play(env, tasks, lambda i, q, obs, info, h: nosearch_response(q.question))

    def em(by_kind):
        return sum(sum(v) for v in by_kind.values()) / 200

    assert em(expert) >= 0.95
    assert all(sum(v) / len(v) >= 0.9 for v in expert.values())  # every kind, not just on average
    assert em(rnd) < 0.10 and em(nosearch) < 0.10
    assert sum(nosearch["comparison"]) == len(nosearch["comparison"]) / 2  # right only by naming an option
    assert sum(sum(v) for k, v in nosearch.items() if k != "comparison") == 0


def test_expert_reads_retrieved_text_not_records(kb):
    """With a retriever that never returns the hop's passage the expert cannot answer a chain question."""

    class Blind:
        def retrieve(self, queries, topk):
            return [[] for _ in queries]

    q = next(q for q in generate_questions(kb, 50, "test") if q.kind == "bridge")
    env = SearchQAEnv(Blind())
    obs, info = env.reset(q, expert=True)
    actions, done = [], False
    while not done:
        actions.append(info["expert_plan"][0])
        obs, _, done, info = env.step(actions[-1])
    assert info["em"] == 0.0
    assert actions[0] == f"<search>{q.plan[1]}</search>"
    assert re.fullmatch(rf"<search>{re.escape(q.plan[1])} \w+</search>", actions[1])  # reformulated once
    assert actions[-1].startswith("<answer>")


def test_baselines_are_reproducible():
    def draw(t):
        return random_response(
            random.Random(f"3:7:{t}"), "Where was Alven Moradi born?", "Doc 1(Title: Xy) z"
        )

    responses = [draw(t) for t in range(20)]
    assert responses == [draw(t) for t in range(20)]
    assert {r[:8] for r in responses} == {"<search>", "<answer>"}  # both kinds of turn
    words = {"Where", "was", "Alven", "Moradi", "born", "Doc", "1", "Title", "Xy", "z"}
    assert all(set(r.split(">", 1)[1].split("<", 1)[0].split()) <= words for r in responses)
    assert first_name_in("Who was born first, Alven Moradi or Sel Kavo?") == "Alven Moradi"
    assert first_name_in("Where was the author of The Last Nybi born?") == "The Last Nybi"
    assert nosearch_response("In which country is Tarsk?") == "<answer>Tarsk</answer>"


def test_questions_held_out_by_question(kb):
    test = generate_questions(kb, 100, "test", seed=0, held_out="questions")
    train = generate_questions(kb, 300, "train", seed=5, held_out="questions")
    assert not {q.question for q in test} & {q.question for q in train}
    pairs = {frozenset(q.plan[3:]) for q in test if q.kind == "comparison"}
    assert not pairs & {frozenset(q.plan[3:]) for q in train if q.kind == "comparison"}  # either option order
    held = held_out_entities(kb)
    assert any(not ({q.plan[1]} & held) for q in test if q.plan[0] == "chain")  # train entities asked anew
    with pytest.raises(ValueError, match="held_out must be one of"):
        generate_questions(kb, 5, "test", held_out="tasks")
