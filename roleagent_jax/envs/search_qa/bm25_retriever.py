"""A local, in-process BM25 index (bm25s) over a passage list or a JSONL corpus.

Good for the generated knowledge base and small corpora; the Wikipedia-scale setup of the papers runs
a dense retriever behind the HTTP server instead. Scoring uses bm25s's numpy backend (never JAX:
environment worker processes must stay light), ties are broken by corpus order so results are
reproducible, and passages that share no term with the query are not returned.

bm25s probes JAX when it is imported and, if JAX is there, runs a computation on JAX's default device.
An environment worker must neither import JAX nor touch the accelerator the trainer holds, so bm25s is
imported with JAX hidden from it (`_import_bm25s`); only its numpy backend is used.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import numpy as np

from roleagent_jax.envs.search_qa.corpus import Passage, load_corpus


def _import_bm25s():
    """bm25s, imported so that its JAX probe fails: "jax" (or "jax.lax" once JAX is loaded) is masked."""
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    masked = "jax.lax" if "jax" in sys.modules else "jax"
    saved = sys.modules.get(masked)
    sys.modules[masked] = None  # makes `import jax.lax` raise ImportError, which bm25s handles
    try:
        return importlib.import_module("bm25s")
    finally:
        if saved is None:
            del sys.modules[masked]
        else:
            sys.modules[masked] = saved


def _tokens(texts: Sequence[str]) -> list[list[str]]:
    return _import_bm25s().tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class BM25Retriever:
    """Lexical top-k retrieval over `passages` (title and text are both indexed)."""

    def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75):
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        bm25s = _import_bm25s()
        self.passages = list(passages)
        self._index = bm25s.BM25(k1=k1, b=b)
        corpus = bm25s.tokenize(
            [f"{p.title}\n{p.text}" for p in self.passages], stopwords="en", show_progress=False
        )
        self._index.index(corpus, show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, **kwargs) -> BM25Retriever:
        return cls(load_corpus(path), **kwargs)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for one query (float32 [num_passages])."""
        terms = _tokens([query])[0]
        if not terms:
            return np.zeros(len(self.passages), np.float32)
        return np.asarray(self._index.get_scores(terms), np.float32)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        out = []
        for query in queries:
            s = self.scores(str(query))
            best = np.argsort(-s, kind="stable")[:topk]
            out.append([self._scored(int(i), float(s[i])) for i in best if s[i] > 0])
        return out

    def _scored(self, i: int, score: float) -> Passage:
        p = self.passages[i]
        return Passage(p.title, p.text, p.id, score)
