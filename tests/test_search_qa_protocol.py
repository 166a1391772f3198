"""Search QA plays the reference protocol by default: whole passages, the reference template and
one-action rule, reward 1.0, and both retrieval servers' request shapes."""

import json

import pytest
import test_search_qa_retrievers

from roleagent_jax.envs.base import Task
from roleagent_jax.envs.registry import get_family
from roleagent_jax.envs.search_qa import BM25Retriever, HTTPRetriever, Passage, SearchQAEnv
from roleagent_jax.envs.search_qa.tasks import QATask

# Three ~100-word passages, as the reference's top 3 of wiki-18: together far over 1,200 characters.
PASSAGES = [
    Passage(
        f"Entity {k}", f"Entity {k} lives in Tarsk. " + " ".join(f"fact{k}_{i}" for i in range(90)), str(k)
    )
    for k in range(3)
]
TASK = QATask("Where does Entity 2 live?", ("Tarsk",), "generated", "single_hop", "q0")


def test_reference_prompt_holds_all_three_passages_uncut():
    family = get_family("search_qa")  # the defaults: the reference's
    env = SearchQAEnv(BM25Retriever(PASSAGES), max_turns=4, topk=3)
    first, _ = env.reset(TASK)
    info_obs, *_ = env.step("<think>look it up</think><search>Tarsk</search>")
    prompt = family.agent_prompt(TASK.question, [(first, "<search>Tarsk</search>")], info_obs, None, 1, 4)
    assert sum(len(p.text) for p in PASSAGES) > 1200
    for p in PASSAGES:
        assert f'Doc {int(p.id) + 1}(Title: "{p.title}") {p.text}' in prompt  # every passage, whole
    assert prompt.startswith(
        "\nYou are an expert agent tasked with answering the given question step-by-step."
    )
    assert "Your question: Where does Entity 2 live?" in prompt and "<search>Tarsk</search>" in prompt
    assert "MUST be enclosed within <think> </think> tags" in prompt
    assert "Prior to this step, you have already taken 1 step(s)." in prompt
    assert "History" not in family.agent_prompt(TASK.question, [], first, None, 0, 4)  # first turn


def test_compact_prompt_cuts_passages_only_when_asked():
    family = get_family("search_qa")
    turn = ([("Question: q", "<search>Tarsk</search>")], "<information>" + "x" * 3000 + "</information>")
    whole = family.configured({"prompt": "compact"}).agent_prompt("q", *turn, None, 1, 4)
    cut = family.configured({"prompt": "compact", "passage_chars": 1200}).agent_prompt("q", *turn, None, 1, 4)
    assert "x" * 3000 in whole and "x" * 1200 not in cut and len(cut) < len(whole)


@pytest.mark.parametrize(
    "response, reference, block",
    [
        ("<think>t</think><search>a</search>", ("<search>a</search>", True), ("<search>a</search>", True)),
        ("<answer>Paris</answer>", ("<answer>Paris</answer>", True), ("<answer>Paris</answer>", True)),
        # both tags, or one twice: the turn found is played, but the reference marks it invalid
        ("<search>a</search><answer>b</answer>", ("<search>a</search>", False), ("<search>a</search>", True)),
        ("<answer>a</answer><answer>b</answer>", ("<answer>a</answer>", False), ("<answer>a</answer>", True)),
        ("no tags", (None, False), (None, False)),
    ],
)
def test_validity_rules(response, reference, block):
    family = get_family("search_qa")
    assert family.parse_action(response, None) == reference
    assert family.configured({"valid": "block"}).parse_action(response, None) == block


def test_reward_scale_is_an_option():
    env = SearchQAEnv(BM25Retriever(PASSAGES), max_turns=4, topk=3)
    env.reset(TASK)
    assert env.step("<answer>Tarsk</answer>")[1] == 1.0  # the reference's
    env = SearchQAEnv(BM25Retriever(PASSAGES), max_turns=4, topk=3, win_reward=10.0)
    env.reset(TASK)
    assert env.step("<answer>Tarsk</answer>")[1] == 10.0


def test_bad_options_name_the_key_and_value():
    family = get_family("search_qa")
    for options, message in (
        ({"prompt": "long"}, "prompt='long'"),
        ({"valid": "any"}, "valid='any'"),
        ({"passage_chars": -1}, "passage_chars=-1"),
        ({"win_reward": 0}, "win_reward=0"),
        ({"retriever_request": "batch"}, "retriever_request='batch'"),
        ({"wording": "terse"}, "wording='terse'"),
    ):
        with pytest.raises(ValueError, match=message):
            family.configured(options)


# ----- the two retrieval servers' request shapes, on loopback ---------------------------------------


class _Server(test_search_qa_retrievers._Server):
    """A retrieval server on 127.0.0.1 that speaks one request shape: Role-Agent's {"query": ...} (one
    query a request) or Search-R1's {"queries": [...]}; any other body gets HTTP 422, as FastAPI does."""

    def __init__(self, shape: str):
        self.shape = shape
        super().__init__()

    def reply(self, body: dict) -> tuple[int, bytes]:
        if self.shape not in body:
            return 422, b'{"detail": "field required"}'
        asked = [body["query"]] if self.shape == "query" else body["queries"]
        result = [self.hits(q, body["topk"], body.get("return_scores")) for q in asked]
        return 200, json.dumps({"result": result}).encode()

    @staticmethod
    def hits(query: str, topk: int, scores: bool) -> list:
        docs = [{"id": p.id, "contents": p.contents} for p in PASSAGES if query.lower() in p.text.lower()][
            :topk
        ]
        return [{"document": d, "score": 1.0} for d in docs] if scores else docs


@pytest.mark.parametrize("shape", ["query", "queries"])
def test_http_retriever_speaks_each_servers_request_shape(shape):
    server = _Server(shape)
    try:
        got = HTTPRetriever(server.url, request=shape, retries=0).retrieve(["fact0_1", "fact2_5"], 3)
        assert [[p.title for p in hits] for hits in got] == [["Entity 0"], ["Entity 2"]]
        if shape == "query":
            assert [r["query"] for r in server.requests] == ["fact0_1", "fact2_5"]
        else:
            assert [r["queries"] for r in server.requests] == [["fact0_1", "fact2_5"]]
        other = "queries" if shape == "query" else "query"
        with pytest.raises(ValueError, match="HTTP 422"):  # the other shape is refused, not misread
            HTTPRetriever(server.url, request=other, retries=0).retrieve(["fact0_1"], 3)
    finally:
        server.close()


def test_family_sends_the_role_agent_shape_by_default(tmp_path):
    server = _Server("query")
    try:
        data = tmp_path / "bamboogle" / "test.jsonl"
        data.parent.mkdir()
        data.write_text(
            json.dumps({"question": "where does fact1_3 live", "golden_answers": ["Tarsk"]}) + "\n"
        )
        family = get_family("search_qa")
        pool = family.task_pool("bamboogle", data_dir=tmp_path, options={"retriever_url": server.url})
        task: Task = pool.tasks[0]
        assert task.goal == "where does fact1_3 live?"  # Search-R1 adds the question mark
        env = family.configured({"retriever_url": server.url}).make_env(4)
        env.reset(task)
        obs = env.step("<search>fact1_3</search>")
        assert server.requests == [
            {"path": "/retrieve", "query": "fact1_3", "topk": 3, "return_scores": True}
        ]
        assert PASSAGES[1].text in obs.text
        assert env.step("<answer>Tarsk</answer>").reward == 1.0
    finally:
        server.close()


def test_wording_of_observations():
    env = SearchQAEnv(BM25Retriever(PASSAGES), max_turns=4, topk=1)  # Search-R1's wording by default
    env.reset(TASK)
    assert env.step("no tags")[0].startswith("My previous action is invalid. If I want to search,")
    assert env.step("<search>fact2_1</search>")[0].startswith('<information>Doc 1(Title: "Entity 2") ')
    env = SearchQAEnv(BM25Retriever(PASSAGES), max_turns=4, topk=1, wording="compact")
    env.reset(TASK)
    assert env.step("no tags")[0].startswith("Invalid turn.")
    assert env.step("<search>fact2_1</search>")[0].startswith("<information>Doc 1(Title: Entity 2) ")
