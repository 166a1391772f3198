"""The search-QA episode engine, the agent prompt and the failure analyser."""

import pytest

from roleagent_jax.envs.search_qa import INVALID_PENALTY, WIN_REWARD, BM25Retriever, Passage, SearchQAEnv
from roleagent_jax.envs.search_qa.engine import CORRECT, FORMAT_REMINDER, INVALID_SEARCH_R1, WRONG
from roleagent_jax.envs.search_qa.heuristic import RULE_ORDER, analyse
from roleagent_jax.envs.search_qa.prompts import build_agent_prompt
from roleagent_jax.envs.search_qa.tasks import QATask
from roleagent_jax.envs.search_qa.taxonomy import SEARCH_QA_TYPES, abstract_question
from roleagent_jax.types import UNKNOWN, Step, Trajectory

PASSAGES = [
    Passage("Alven Moradi", "Alven Moradi (born 1874 in Tarsk) is a painter.", "0"),
    Passage("Tarsk", "Tarsk is a city in Veltia, founded in 1412.", "1"),
    Passage("Veltia", "Veltia is a country whose capital is Tarsk.", "2"),
    Passage("Orrin", "Orrin is a river in Veltia.", "3"),
]
TASK = QATask("In which country was Alven Moradi born?", ("Veltia",), "generated", "bridge", "q0",
              ("chain", "Alven Moradi", "birthplace", "country"))  # fmt: skip


@pytest.fixture
def env():
    return SearchQAEnv(BM25Retriever(PASSAGES), max_turns=4, topk=2)


def test_search_then_answer(env):
    obs, info = env.reset(TASK)
    assert obs == info["anchor"] == "Question: In which country was Alven Moradi born?"
    obs, r, done, info = env.step("<think>look up</think><search>Alven Moradi</search>")
    assert (r, done, info["valid"], info["turn_kind"], info["step"]) == (0.0, False, True, "search", 1)
    assert obs.startswith('<information>Doc 1(Title: "Alven Moradi") Alven Moradi (born 1874 in Tarsk)')
    assert obs.count("Doc ") == 1 and obs == info["anchor"]  # only passages sharing a term; text = anchor
    obs, _, _, _ = env.step("<search>Veltia</search>")
    assert obs.count("Doc ") == 2  # topk of the three that name Veltia
    obs, r, done, info = env.step("<answer>the veltia</answer>")
    assert (obs, r, done, info["won"], info["em"]) == (CORRECT, WIN_REWARD, True, True, 1.0)
    assert info["answer"] == "the veltia"
    assert env.step("<answer>Veltia</answer>")[1:3] == (0.0, True)  # a finished episode stays finished


def test_wrong_answer_invalid_turns_and_turn_limit(env):
    env.reset(TASK)
    obs, r, done, info = env.step("I think it is Veltia")
    assert (obs, r, done, info["valid"], info["turn_kind"]) == (
        INVALID_SEARCH_R1,
        0.0,
        False,
        False,
        "invalid",
    )
    env.step("<search>Tarsk</search>")
    obs, _, done, info = env.step("<search>Orrin</search>")
    assert not done and obs == info["anchor"]
    obs, r, done, info = env.step("<search>Veltia</search>")  # the fourth turn ends it, unanswered
    assert (r, done, info["won"], info["em"]) == (0.0, True, False, 0.0)
    env.reset(TASK)
    obs, r, done, info = env.step("<answer>Tarsk</answer>")
    assert (obs, r, done, info["won"]) == (WRONG, 0.0, True, False)
    assert INVALID_PENALTY == 0.01


def test_identical_results_share_an_anchor(env):
    env.reset(TASK)
    a = env.step("<search>Alven Moradi</search>")[3]["anchor"]
    env.reset(TASK)
    b = env.step("<search>  alven   moradi </search>")[3]["anchor"]
    assert a == b


def test_expert_plan_in_info(env):
    _, info = env.reset(TASK, expert=True)
    assert info["expert_plan"] == ["<search>Alven Moradi</search>"]
    _, _, _, info = env.step(info["expert_plan"][0])
    assert info["expert_plan"] == ["<search>Tarsk</search>"]
    _, _, _, info = env.step(info["expert_plan"][0])
    assert info["expert_plan"] == ["<answer>Veltia</answer>"]
    with pytest.raises(ValueError, match="has no plan"):
        env.reset(QATask("q?", ("a",), "nq", "nq"), expert=True)


def test_agent_prompt_shows_actions_with_their_results():
    history = [("Question: q", "<search>A</search>"), ("<information>Doc 1(Title: A) a</information>", "bad")]
    text = build_agent_prompt("Where?", history, "Invalid turn.", step=2, k=3)
    lines = text.splitlines()
    assert lines[1:3] == ["Question: Where?", "Turn 3."]
    assert lines[3:] == [
        "<search>A</search>",
        "<information>Doc 1(Title: A) a</information>",
        "bad",
        "Invalid turn.",
    ]
    assert build_agent_prompt("Where?", history, "x", step=2, k=1).splitlines()[3:] == ["bad", "x"]
    assert build_agent_prompt("Where?", [], "Question: Where?", step=0).splitlines()[1:] == [
        "Question: Where?",
        "Turn 1.",
    ]


# ------------------------------------------------------------------------------------------ failures


def _traj(kind: str, turns: list[tuple[str, str]], won=False) -> Trajectory:
    steps = []
    for response, result in turns:
        from roleagent_jax.envs.search_qa.parser import parse_turn

        t = parse_turn(response)
        steps.append(Step("obs", [], response, t.action, t.valid, 0.0, result))
    return Trajectory(0, kind, "In which country was Alven Moradi born?", steps, won=won)


INFO_A = (
    "<information>Doc 1(Title: Alven Moradi) Alven Moradi (born 1874 in Tarsk) is a painter.</information>"
)
INFO_T = "<information>Doc 1(Title: Tarsk) Tarsk is a city in Veltia.</information>"

CASES = {
    "format_error": [("blah", FORMAT_REMINDER), ("still blah", FORMAT_REMINDER), ("<answer>x</answer>", WRONG)],
    "no_search": [("<answer>Veltia Republic</answer>", WRONG)],
    "repeated_query": [("<search>Alven Moradi</search>", INFO_A), ("<search>alven moradi</search>", INFO_A),
                       ("<answer>Orrin</answer>", WRONG)],
    "query_drift": [("<search>Alven Moradi</search>", INFO_A), ("<search>famous rivers</search>", "No results."),
                    ("<answer>Orrin</answer>", WRONG)],
    "out_of_turns": [("<search>Alven Moradi</search>", INFO_A), ("<search>Tarsk</search>", INFO_T),
                     ("<search>Veltia capital</search>", INFO_T), ("<search>Veltia</search>", INFO_T)],
    "stopped_after_first_hop": [("<search>Alven Moradi</search>", INFO_A), ("<answer>Tarsk</answer>", WRONG)],
    "verbose_answer": [("<search>Alven Moradi</search>", INFO_A), ("<search>Tarsk</search>", INFO_T),
                       ("<answer>the country of Veltia in the north</answer>", WRONG)],
    "wrong_entity": [("<search>Alven Moradi</search>", INFO_A), ("<search>Tarsk</search>", INFO_T),
                     ("<answer>Tarsk</answer>", WRONG)],
    "answer_without_evidence": [("<search>Alven Moradi</search>", INFO_A), ("<search>Tarsk</search>", INFO_T),
                                ("<answer>Norland</answer>", WRONG)],
}  # fmt: skip


@pytest.mark.parametrize("expected", list(CASES))
def test_each_failure_rule(expected):
    report = analyse(_traj("bridge", CASES[expected]), golds=("Veltia",))
    assert report.failure_type == expected, report.detail
    assert report.source == "heuristic" and report.critical_step is not None
    assert "two-hop bridge question" in report.query and "Alven" not in report.lesson + report.query


def test_failure_analysis_edges():
    assert set(CASES) == set(SEARCH_QA_TYPES) == set(RULE_ORDER) and len(SEARCH_QA_TYPES) == 9
    won = analyse(
        _traj("bridge", CASES["wrong_entity"][:2] + [("<answer>Veltia</answer>", CORRECT)], won=True)
    )
    assert (won.failure_type, won.detail) == (UNKNOWN, "episode won")
    single = analyse(_traj("single_hop", CASES["stopped_after_first_hop"]), golds=("1874",))
    assert single.failure_type == "wrong_entity"  # one search is enough for a single-hop question
    long = CASES["wrong_entity"][:2] + [
        ("<answer>a country of Veltia in the far north east corner</answer>", WRONG)
    ]
    no_golds = analyse(_traj("hotpotqa", long))  # without golds, only the length tells a verbose answer
    assert no_golds.failure_type == "verbose_answer" and "multi-hop question" in no_golds.query
    assert analyse(_traj("hotpotqa", CASES["wrong_entity"])).failure_type == "wrong_entity"


def test_abstract_question():
    assert (
        abstract_question("Where was the author of The Last Nybi born?") == "where was the author of X born?"
    )
    assert abstract_question("Who was born first, Alven Moradi or Sel Kavo?") == "who was born first, X or X?"


def test_state_is_the_question_and_the_passages_so_far(env):
    _, info = env.reset(TASK)
    start = info["state"]
    assert start == info["anchor"]
    first, _, _, info = env.step("<search>Alven Moradi</search>")
    after_one = info["state"]
    assert after_one == start + "\n" + first
    _, _, _, info = env.step("no tags at all")  # invalid: nothing retrieved, the state stays
    assert info["state"] == after_one and info["anchor"] != after_one
    again, _, _, info = env.step("<search>Alven Moradi</search>")  # the same passages a second time
    assert again == first and info["anchor"] == first and info["state"] != after_one
