"""A client for the retrieval servers of Search-R1 / FlashRAG and of Role-Agent: `POST /retrieve`.

Request, by `request`: "queries" (Search-R1's server) {"queries": [...], "topk": k, "return_scores": bool},
one request per batch; "query" (Role-Agent's and verl-agent's server) {"query": "...", "topk": k,
"return_scores": bool}, one request per query. Response: {"result": [...]} with one list per query
asked, of corpus records ({"id", "contents"}), or of {"document": record, "score": s} when scores were
asked for. Standard library only (urllib): one request per batch of queries, a timeout on each,
and a few retries with growing waits for what a restart or an overload causes (connection refused,
timeouts, HTTP 429 / 5xx). Everything else fails at once with the URL in the message.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from roleagent_jax.envs.search_qa.corpus import Passage

_RETRY_STATUS = {429, 500, 502, 503, 504}
REQUESTS = ("query", "queries")  # Role-Agent's server | Search-R1's server


class RetrieverUnavailable(ConnectionError):
    """The retrieval server could not be reached (or kept failing) after every retry."""


def endpoint(url: str) -> str:
    """The /retrieve endpoint of a server URL ("http://host:8000" -> "http://host:8000/retrieve")."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"retriever url must look like http://host:port/retrieve, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/retrieve")
    return urllib.parse.urlunsplit(parts)


class HTTPRetriever:
    """Retrieval through a running server; `retrieve(queries, topk)` -> passages per query, best first."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        return_scores: bool = True,
        request: str = "queries",
    ):
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError("retriever timeout must be > 0, retries and backoff >= 0")
        if request not in REQUESTS:
            raise ValueError(f"retriever_request={request!r}: must be one of {', '.join(REQUESTS)}")
        self.url = endpoint(url)
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.return_scores, self.request = return_scores, request

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        queries = [str(q) for q in queries]
        if not queries:
            return []
        asked = {"topk": topk, "return_scores": self.return_scores}
        if self.request == "queries":
            payload = self._post(json.dumps({"queries": queries, **asked}).encode())
            return self._parse(payload, len(queries), topk)
        out = []
        for q in queries:
            out += self._parse(self._post(json.dumps({"query": q, **asked}).encode()), 1, topk)
        return out

    def _post(self, body: bytes) -> dict:
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(
                self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read(300).decode("utf-8", "replace").strip()
                if exc.code not in _RETRY_STATUS:
                    raise ValueError(
                        f"retrieval server {self.url} answered HTTP {exc.code}: {detail}"
                    ) from exc
                last = f"answered HTTP {exc.code}"
                continue
            except TimeoutError:
                last = f"did not answer within {self.timeout:g}s"
                continue
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    last = f"did not answer within {self.timeout:g}s"
                else:
                    last = f"is not reachable ({reason})"
                continue
            try:
                return json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"retrieval server {self.url} sent a body that is not JSON") from exc
        raise RetrieverUnavailable(
            f"retrieval server {self.url} {last} after {attempts} attempt(s); start the server "
            "(Role-Agent's or Search-R1's retrieval_server.py) or use the local BM25 retriever"
        )

    def _parse(self, payload, n: int, topk: int) -> list[list[Passage]]:
        result = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(result, list) or len(result) != n:
            got = f"{len(result)} lists" if isinstance(result, list) else "no 'result' list"
            raise ValueError(f"retrieval server {self.url}: expected 'result' with {n} lists, got {got}")
        out = []
        for q, hits in enumerate(result):
            if not isinstance(hits, list):
                raise ValueError(f"retrieval server {self.url}: result {q} is not a list")
            passages = []
            for hit in hits[:topk]:
                where = f"retrieval server {self.url}, result {q}"
                if isinstance(hit, dict) and isinstance(hit.get("document"), dict):
                    p = Passage.from_record(hit["document"], where)
                    score = hit.get("score")
                    p = Passage(p.title, p.text, p.id, float(score) if score is not None else None)
                else:
                    p = Passage.from_record(hit, where)
                passages.append(p)
            out.append(passages)
        return out
