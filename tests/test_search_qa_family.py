"""Search QA through the environment contract: registry, task pools, the env adapter, prompts, AIW and
the evaluation's second-search rates."""

import json
import pickle

import pytest

from roleagent_jax.envs.base import Observation, Task, TaskPool
from roleagent_jax.envs.registry import get_family, registered
from roleagent_jax.envs.search_qa import load_corpus, load_flashrag
from roleagent_jax.envs.search_qa.family import SearchQA
from roleagent_jax.envs.search_qa.questions import KINDS
from roleagent_jax.envs.search_qa.second_search import count_searches
from roleagent_jax.envs.search_qa.tasks import DATASETS
from roleagent_jax.types import Step, Trajectory


@pytest.fixture(scope="module")
def family():
    return get_family("search_qa")


def _play(env, task, actions) -> list[Observation]:
    out = [env.reset(task)]
    for a in actions:
        out.append(env.step(a))
    return out


def test_registered(family):
    assert "search_qa" in registered() and isinstance(family, SearchQA)
    assert family.task_types == (*KINDS, *DATASETS) and family.has_expert
    assert family.generated_splits == ("gen_train", "gen_test")


def test_generated_pools_and_their_expert_plans(family, tmp_path):
    pool = family.task_pool("gen_test", n=40, seed=0, gen_dir=tmp_path)
    again = family.task_pool("gen_test", n=40, seed=0)
    assert [t.goal for t in pool.tasks] == [t.goal for t in again.tasks] and len(pool) == 40
    train = family.task_pool("gen_train", n=40, seed=1)
    assert not {t.goal for t in train.tasks} & {t.goal for t in pool.tasks}
    assert set(pool.type_counts()) == set(KINDS)
    assert len(pool.expert_plans) == 40  # the expert won every question with the real retriever
    env = family.make_env(4)
    for i, plan in pool.expert_plans.items():
        final = _play(env, pool[i], plan)[-1]
        assert (
            final.done and final.won and final.score == 1.0 and final.reward == 1.0
        )  # the reference's reward
    assert pickle.loads(pickle.dumps(pool)).tasks == pool.tasks
    folder = next(tmp_path.iterdir())
    assert len(load_corpus(folder / "corpus.jsonl")) == 460
    written = load_flashrag(folder / "gen_test_n40_seed0.jsonl", "nq")
    assert [(q.question, q.golds) for q in written] == [(t.goal, t.payload.task.golds) for t in pool.tasks]


def test_generation_options(family):
    pool = family.task_pool(
        "gen_test", n=12, options={"mix": {"comparison": 1.0}, "kb_people": 80, "kb_works": 100}
    )
    assert pool.type_counts() == {"comparison": 12}
    for flag in ("single_hop:1,bridge:1", ("single_hop:1", "bridge:1")):  # as command-line flags give it
        assert family.task_pool("gen_test", n=10, options={"mix": flag}).type_counts() == {
            "single_hop": 5,
            "bridge": 5,
        }
    with pytest.raises(ValueError, match="must be kind:weight items"):
        family.task_pool("gen_test", n=5, options={"mix": "single_hop"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['rooms'\] for environment 'search_qa'"):
        family.task_pool("gen_test", n=5, options={"rooms": 3})
    with pytest.raises(ValueError, match="give the number of questions"):
        family.task_pool("gen_test")
    with pytest.raises(ValueError, match="unknown question kinds"):
        family.task_pool("gen_test", n=5, options={"mix": {"trivia": 1.0}})


def test_questions_spread_over_several_worlds(family, tmp_path):
    """kb_worlds spreads a split over knowledge bases, each task answered by its own world's index; with
    held_out "worlds" no held-out question asks a knowledge base any training question asks, and the
    expert still wins every question on its world's retriever."""
    opts = {"kb_worlds": 4, "held_out": "worlds"}
    train = family.task_pool("gen_train", n=30, seed=0, options=opts, gen_dir=tmp_path)
    test = family.task_pool("gen_test", n=10, seed=1, options=opts)
    worlds = lambda pool: [t.payload.retriever[1] for t in pool.tasks]  # noqa: E731
    assert sorted(set(worlds(train))) == [0, 1, 2, 3] and sorted(set(worlds(test))) == [
        1000,
        1001,
        1002,
        1003,
    ]
    assert sorted(worlds(test).count(w) for w in set(worlds(test))) == [2, 2, 3, 3]
    assert len({t.payload.task.id for t in train.tasks}) == 30
    assert len(train.expert_plans) == 30 and len(test.expert_plans) == 10
    env = family.make_env(4)
    for pool in (train, test):
        for i, plan in pool.expert_plans.items():
            assert _play(env, pool[i], plan)[-1].won
    assert len(list(tmp_path.iterdir())) == 4
    with pytest.raises(ValueError, match="'kb_worlds' must be an integer >= 1, got 0"):
        family.task_pool("gen_test", n=5, options={"kb_worlds": 0})


def test_env_observations(family):
    pool = family.task_pool("gen_test", n=30, seed=0)
    i, task = next((i, t) for i, t in enumerate(pool.tasks) if t.type == "bridge")
    env = family.make_env(2)
    start = env.reset(task, expert=True)
    assert start.text == start.anchor == f"Question: {task.goal}" and start.admissible is None
    assert start.expert_plan == [pool.expert_plans[i][0]] and start.score is None
    first = env.step(start.expert_plan[0])
    assert first.anchor.startswith("<information>") and first.text == first.anchor
    assert not first.done and first.score is None and first.info["valid"]
    bad = env.step("no tags")
    assert bad.done and not bad.won and bad.score == 0.0 and bad.info["valid"] is False  # 2 turns used
    long = family.make_env(50)  # a generic step budget does not lift the task's limit of 4 turns
    long.reset(task)
    assert [long.step("<search>x</search>").done for _ in range(4)] == [False, False, False, True]
    one_turn = family.task_pool("gen_test", n=3, options={"max_turns": 1})
    long.reset(one_turn[0])
    assert long.step("<search>x</search>").done
    with pytest.raises(ValueError, match="is not a search-QA task"):
        env.reset(type(task)("x", "nq", "q?", payload="file.json"))


def _flashrag(tmp_path):
    for name, split, q, a in (("nq", "train", "where is tarsk?", "Veltia"), ("hotpotqa", "train", "who?", "Moradi"),
                              ("nq", "test", "capital of veltia?", "Tarsk")):  # fmt: skip
        path = tmp_path / "data" / name / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"question": q, "golden_answers": [a]}) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"id": str(i), "contents": c}) for i, c in enumerate(
            ['"Tarsk"\nTarsk is a city in Veltia.', '"Veltia"\nVeltia is a country whose capital is Tarsk.']))
    )  # fmt: skip
    return tmp_path / "data", corpus


def test_real_splits_with_a_local_corpus(family, tmp_path):
    data, corpus = _flashrag(tmp_path)
    opts = {"corpus": str(corpus)}
    joint = family.task_pool("nq:train+hotpotqa:train", data_dir=data, options=opts)
    assert [(t.type, t.goal) for t in joint.tasks] == [("nq", "where is tarsk?"), ("hotpotqa", "who?")]
    assert joint.expert_plans == {}
    test = family.task_pool("nq", data_dir=data, options=opts)  # Search-R1's eval split of NQ: test
    single = family.task_pool("nq", data_dir=data / "nq" / "test.jsonl", options=opts)  # or the file itself
    assert [t.goal for t in test.tasks] == [t.goal for t in single.tasks] == ["capital of veltia?"]
    obs = _play(family.make_env(4), test[0], ["<search>Veltia capital</search>", "<answer>Tarsk</answer>"])
    assert obs[1].text.startswith('<information>Doc 1(Title: "Veltia")') and obs[2].won
    with pytest.raises(ValueError, match="needs a retriever: set the env option retriever_url"):
        family.task_pool("nq", data_dir=data)
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        family.task_pool("nq", data_dir=data, options={"corpus": str(tmp_path / "none.jsonl")})
    with pytest.raises(FileNotFoundError, match="is real data: give its folder or file"):
        family.task_pool("nq", options=opts)
    with pytest.raises(FileNotFoundError, match=r"popqa file not found: .*popqa/test.jsonl"):
        family.task_pool("popqa", data_dir=data, options=opts)
    with pytest.raises(
        ValueError, match="unknown search_qa split 'squad': generated gen_train, gen_test, or real"
    ):
        family.task_pool("squad", data_dir=data, options=opts)


def test_agent_side(family):
    assert family.parse_action("<think>x</think><search> a  b </search> junk", None) == (
        "<search>a b</search>",
        True,
    )
    assert family.parse_action("<answer>Tarsk</answer>", None) == ("<answer>Tarsk</answer>", True)
    assert family.parse_action("nothing", None) == (None, False)
    for action in ("<search>a b</search>", "<answer>Tarsk</answer>"):
        assert family.parse_action(family.format_action(action), None) == (action, True)
    assert family.unparsed_action("   ") == "" and family.action_stop == "</search>"
    compact = family.configured({"prompt": "compact"})
    prompt = compact.agent_prompt("Where?", [("Question: Where?", "<search>A</search>")], "<information>x</information>",
                                  None, 1, 2)  # fmt: skip
    assert "Question: Where?" in prompt and prompt.endswith(
        "<search>A</search>\n<information>x</information>"
    )
    wia_prompt = family.predictor_prompt("Where?", [], "Question: Where?", "<search>A</search>", 1)
    assert (
        wia_prompt.startswith("Act as the search engine.") and "Write what the search returns" in wia_prompt
    )


def test_aiw_side(family):
    steps = [Step("Question: q", [], "<answer>Tarsk</answer>", "<answer>Tarsk</answer>", True, 0.0, "wrong")]
    report = family.analyse_failure(
        Trajectory(0, "bridge", "In which country was Alven Moradi born?", steps), 4
    )
    assert report.failure_type == "no_search" and report.failure_type in family.failure_types
    assert (
        family.abstract_goal("In which country was Alven Moradi born?", "bridge")
        == "in which country was X born?"
    )
    assert family.pattern_name("comparison") == "comparison question"
    assert family.pattern_name("musique") == "multi-hop question"
    assert "follow three passages" in family.pattern_text("bridge3")
    assert all(t in family.failure_types for _, t in family.failure_keywords)


def _episode(task_id: int, task_type: str, actions, env_failed: bool = False) -> Trajectory:
    steps = [Step("o", None, a or "junk", a, a is not None, 0.0, "o") for a in actions]
    return Trajectory(task_id, task_type, "q", steps, env_failed=env_failed)


def test_an_action_counts_as_a_search_when_the_env_plays_it_as_one():
    actions = ["<search>a</search>", "<think>x</think><search> b </search>", None, "<answer>c</answer>"]
    assert count_searches(actions) == 2 and count_searches(["nothing", "<search></search>"]) == 0
    assert count_searches(()) == 0


def test_second_search_rates_over_expert_and_one_search_episodes(family):
    """A task needs a second search when its expert plan holds two or more; an episode made one when its
    played actions do. Episodes played as the plans say search twice exactly where it is needed; one
    search on every task makes no second search anywhere."""
    pool = family.task_pool("gen_test", n=12, seed=0)
    needs = [count_searches(t.expert_plan) >= 2 for t in pool.tasks]
    assert 0 < sum(needs) < len(pool)  # both kinds (single hops and most bridges need one search)
    counts = {
        "needs_second_search": sum(needs),
        "needs_no_second_search": len(pool) - sum(needs),
    }
    expert = [_episode(i, t.type, t.expert_plan) for i, t in enumerate(pool.tasks)]
    rates = family.behaviour(expert, pool)
    assert isinstance(rates["needs_second_search"], int) and isinstance(rates["second_search_needed"], float)
    assert rates == {
        "second_search_needed": 1.0,
        "second_search_not_needed": 0.0,
        **counts,
    }
    once = [_episode(i, t.type, [t.expert_plan[0], "<answer>x</answer>"]) for i, t in enumerate(pool.tasks)]
    assert family.behaviour(once, pool) == {
        "second_search_needed": 0.0,
        "second_search_not_needed": 0.0,
        **counts,
    }
    # half the needing tasks searched twice (an invalid turn between the searches counts for nothing)
    needing = [i for i, n in enumerate(needs) if n]
    twice = [_episode(i, "bridge", ["<search>a</search>", None, "<search>b</search>"]) for i in needing[:1]]
    once_more = [_episode(i, "bridge", ["<search>a</search>", None]) for i in needing[1:2]]
    assert family.behaviour(twice + once_more, pool) == {
        "second_search_needed": 0.5,
        "needs_second_search": 2,
        "needs_no_second_search": 0,
    }  # no episode on a task that needs one search: that rate is left out


def test_tasks_without_an_expert_plan_and_failed_environments_are_left_out(family):
    plan = ("<search>a</search>", "<search>b</search>", "<answer>c</answer>")
    pool = TaskPool([Task("q0", "hotpotqa", "q"), Task("q1", "bridge", "q", expert_plan=plan)])
    real = _episode(0, "hotpotqa", ["<search>a</search>", "<search>b</search>"])
    assert family.behaviour([real], pool) == {}  # a real data set's question has no plan
    failed = _episode(1, "bridge", plan, env_failed=True)
    assert family.behaviour([real, failed], pool) == {}
    assert family.behaviour([real, _episode(1, "bridge", plan)], pool) == {
        "second_search_needed": 1.0,
        "needs_second_search": 1,
        "needs_no_second_search": 0,
    }
