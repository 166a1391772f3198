"""Search-augmented QA: search with <search>, answer with <answer>, scored by exact match.

Retrievers (an HTTP client for the Search-R1 / FlashRAG retrieval server, a local BM25 index), the
seven QA datasets (FlashRAG JSONL, and NQ-open / TriviaQA through TFDS), a generated knowledge base
with its questions and expert as the embedded default, the episode engine, prompts and the AIW
failure taxonomy. Nothing here imports JAX.
"""

from roleagent_jax.envs.search_qa.answers import exact_match, extract_answer, normalize_answer
from roleagent_jax.envs.search_qa.bm25_retriever import BM25Retriever
from roleagent_jax.envs.search_qa.corpus import Passage, Retriever, format_information, load_corpus
from roleagent_jax.envs.search_qa.engine import INVALID_PENALTY, MAX_TURNS, TOPK, WIN_REWARD, SearchQAEnv
from roleagent_jax.envs.search_qa.http_retriever import HTTPRetriever, RetrieverUnavailable
from roleagent_jax.envs.search_qa.parser import Turn, parse_turn
from roleagent_jax.envs.search_qa.tasks import DATASETS, QATask, load_flashrag

__all__ = [
    "DATASETS", "INVALID_PENALTY", "MAX_TURNS", "TOPK", "WIN_REWARD", "BM25Retriever", "HTTPRetriever",
    "Passage", "QATask", "Retriever", "RetrieverUnavailable", "SearchQAEnv", "Turn", "exact_match",
    "extract_answer", "format_information", "load_corpus", "load_flashrag", "normalize_answer", "parse_turn",
]  # fmt: skip
