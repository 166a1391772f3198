"""Retrievers: the HTTP client against a loopback retrieval server, and the local BM25 index."""

import json
import math
import re
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from roleagent_jax.envs.search_qa import BM25Retriever, HTTPRetriever, Passage, RetrieverUnavailable
from roleagent_jax.envs.search_qa.corpus import format_information, load_corpus, parse_information
from roleagent_jax.envs.search_qa.http_retriever import endpoint

DOCS = [
    {"id": "0", "contents": '"Tarsk"\nTarsk is a city in Veltia.'},
    {"id": "1", "contents": '"Veltia"\nVeltia is a country whose capital is Tarsk.'},
    {"id": "2", "contents": '"Orrin"\nOrrin is a river.'},
]


class _Server:
    """A retrieval server on 127.0.0.1 (ephemeral port) whose behaviour each test scripts; `reply` decides
    each answer (a subclass can speak another protocol)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list = []  # per request: "ok" | ("status", code) | ("sleep", seconds) | ("body", obj)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, **body})
                status, data = outer.reply(body)
                try:
                    self.send_response(status)
                    if status == 200:
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def reply(self, body: dict) -> tuple[int, bytes]:
        """(HTTP status, response body) for one request, as the script's next step says."""
        action = self.script.pop(0) if self.script else "ok"
        if isinstance(action, tuple) and action[0] == "sleep":
            time.sleep(action[1])
        if isinstance(action, tuple) and action[0] == "status":
            return action[1], b"overloaded" if action[1] >= 500 else b"bad request"
        payload = action[1] if isinstance(action, tuple) and action[0] == "body" else self.answer(body)
        return 200, json.dumps(payload).encode()

    @staticmethod
    def answer(body: dict) -> dict:
        out = []
        for q in body["queries"]:
            hits = [d for d in DOCS if q.lower() in d["contents"].lower()][: body["topk"]]
            if body.get("return_scores"):
                out.append([{"document": d, "score": 1.0 / (i + 1)} for i, d in enumerate(hits)])
            else:
                out.append(hits)
        return {"result": out}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def test_http_retrieve_with_and_without_scores(server):
    r = HTTPRetriever(server.url, timeout=5)
    got = r.retrieve(["tarsk", "orrin", "nothing"], topk=2)
    assert server.requests[0] == {"path": "/retrieve", "queries": ["tarsk", "orrin", "nothing"], "topk": 2,
                                  "return_scores": True}  # fmt: skip
    assert [[p.title for p in hits] for hits in got] == [["Tarsk", "Veltia"], ["Orrin"], []]
    assert got[0][0] == Passage("Tarsk", "Tarsk is a city in Veltia.", "0", 1.0)
    plain = HTTPRetriever(server.url.removesuffix("/retrieve"), return_scores=False).retrieve(["veltia"], 3)
    assert server.requests[1]["path"] == "/retrieve" and server.requests[1]["return_scores"] is False
    assert [(p.title, p.score) for p in plain[0]] == [("Tarsk", None), ("Veltia", None)]
    assert r.retrieve([], 3) == [] and len(server.requests) == 2  # nothing to ask: no request


def test_http_retries_transient_errors_then_succeeds(server):
    server.script = [("status", 503), ("status", 502)]
    got = HTTPRetriever(server.url, retries=2, backoff=0.01).retrieve(["orrin"], 1)
    assert [p.title for p in got[0]] == ["Orrin"] and len(server.requests) == 3


def test_http_gives_up_after_retries_naming_the_url(server):
    server.script = [("status", 503)] * 3
    with pytest.raises(
        RetrieverUnavailable, match=re.escape(server.url) + r" answered HTTP 503 after 2 attempt"
    ):
        HTTPRetriever(server.url, retries=1, backoff=0.0).retrieve(["orrin"], 1)


def test_http_client_error_fails_at_once(server):
    server.script = [("status", 400)]
    with pytest.raises(ValueError, match=r"HTTP 400: bad request"):
        HTTPRetriever(server.url, retries=3, backoff=0.0).retrieve(["orrin"], 1)
    assert len(server.requests) == 1


def test_http_timeout(server):
    server.script = [("sleep", 1.0), ("sleep", 1.0)]
    start = time.perf_counter()
    with pytest.raises(RetrieverUnavailable, match=r"did not answer within 0.2s after 2 attempt"):
        HTTPRetriever(server.url, timeout=0.2, retries=1, backoff=0.0).retrieve(["orrin"], 1)
    assert time.perf_counter() - start < 1.5  # the client did not wait for the slow answers


def test_http_server_down():
    # Bound but never listening: connections are refused, and no other process can take the port meanwhile.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
        refused = re.escape(url) + r" is not reachable .* after 3 attempt"
        with pytest.raises(RetrieverUnavailable, match=refused):
            HTTPRetriever(url, timeout=1, retries=2, backoff=0.0).retrieve(["x"], 3)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"result": [[]]}, r"expected 'result' with 2 lists, got 1"),
        ({"nope": 1}, r"got no 'result' list"),
        ({"result": [[{"id": "1"}], []]}, r"needs a 'contents' string"),
    ],
)
def test_http_malformed_answers(server, body, message):
    server.script = [("body", body)]
    with pytest.raises(ValueError, match=message):
        HTTPRetriever(server.url).retrieve(["a", "b"], 3)


def test_http_arguments():
    assert endpoint("http://h:8000") == "http://h:8000/retrieve"
    assert endpoint("http://h:8000/custom") == "http://h:8000/custom"
    with pytest.raises(ValueError, match="must look like http://host:port/retrieve"):
        HTTPRetriever("localhost:8000")
    with pytest.raises(ValueError, match="topk must be >= 1"):
        HTTPRetriever("http://h:1").retrieve(["a"], 0)


# ---------------------------------------------------------------------------------------------- BM25

CORPUS = [
    Passage("Tarsk", "Tarsk city Veltia founded river Orrin", "0"),
    Passage("Veltia", "Veltia country capital Tarsk language Veltish", "1"),
    Passage("Moradi", "Alven Moradi painter born Tarsk", "2"),
    Passage("Orrin", "Orrin river flows north", "3"),
    Passage("Kelmar", "Kelmar opera composed Moradi", "4"),
]


def _reference_bm25(query: str, docs: list[str], k1=1.5, b=0.75) -> list[float]:
    """Lucene's BM25 written out: idf = ln(1 + (N - df + .5) / (df + .5)) times the length-normalised
    saturated tf, tf / (tf + k1 (1 - b + b dl / avgdl)) (Lucene 8 dropped the constant factor k1 + 1)."""
    toks = [re.findall(r"\w\w+", d.lower()) for d in docs]
    avgdl = sum(map(len, toks)) / len(toks)
    df = Counter(t for d in toks for t in set(d))
    out = []
    for d in toks:
        tf, s = Counter(d), 0.0
        for t in set(re.findall(r"\w\w+", query.lower())):
            if tf[t]:
                idf = math.log(1 + (len(toks) - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


@pytest.mark.parametrize("query", ["Tarsk", "river Orrin", "Moradi opera", "veltish capital"])
def test_bm25_scores_match_the_formula(query):
    r = BM25Retriever(CORPUS)
    ref = _reference_bm25(query, [f"{p.title}\n{p.text}" for p in CORPUS])
    assert r.scores(query).tolist() == pytest.approx(ref, rel=1e-5)


def test_bm25_ranking_topk_and_no_match():
    r = BM25Retriever(CORPUS)
    got = r.retrieve(["Orrin river", "Moradi", "zzz unknown", "the of"], topk=2)
    assert [p.title for p in got[0]] == ["Orrin", "Tarsk"]
    assert {p.title for p in got[1]} == {"Moradi", "Kelmar"} and got[1][0].score >= got[1][1].score
    assert got[2] == [] and got[3] == []  # nothing shared with the corpus (stopwords only): no passage


def test_bm25_ties_follow_corpus_order():
    docs = [Passage(f"T{i}", "same words here", str(i)) for i in range(5)]
    assert [p.id for p in BM25Retriever(docs).retrieve(["words"], 3)[0]] == ["0", "1", "2"]


def test_bm25_from_jsonl_and_corpus_errors(tmp_path):
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps(d) for d in DOCS] + ["", json.dumps({"title": "Kelmar", "text": "An opera."})]
    path.write_text("\n".join(lines) + "\n")
    passages = load_corpus(path)
    assert [(p.id, p.title) for p in passages] == [
        ("0", "Tarsk"),
        ("1", "Veltia"),
        ("2", "Orrin"),
        ("4", "Kelmar"),
    ]
    assert BM25Retriever.from_jsonl(path).retrieve(["opera"], 3)[0][0].title == "Kelmar"
    with pytest.raises(FileNotFoundError, match="corpus file not found: .*missing.jsonl"):
        load_corpus(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(DOCS[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_corpus(bad)
    bad.write_text(json.dumps({"id": "1", "body": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a passage needs a 'contents' string"):
        load_corpus(bad)


def test_information_round_trip():
    text = format_information(CORPUS[:3])
    assert text.splitlines()[0] == "Doc 1(Title: Tarsk) Tarsk city Veltia founded river Orrin"
    assert [(p.title, p.text) for p in parse_information(f"<information>{text}</information>")] == [
        (p.title, p.text) for p in CORPUS[:3]
    ]
    assert format_information([]) == "No results." and parse_information("No results.") == []
