"""QA tasks and the FlashRAG JSONL loaders for the seven evaluation sets.

FlashRAG (and Search-R1, which uses its files) distributes every set as JSONL with one question per
line: {"id", "question", "golden_answers": [...], "metadata"}. Search-R1 trains on NQ + HotpotQA and
evaluates on the test split of NQ, TriviaQA, PopQA, Bamboogle and the dev split of HotpotQA,
2WikiMultiHopQA, MuSiQue (those have no public test answers).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# name -> (hops, the split Search-R1 evaluates on)
DATASETS: dict[str, tuple[str, str]] = {
    "nq": ("single-hop", "test"),
    "triviaqa": ("single-hop", "test"),
    "popqa": ("single-hop", "test"),
    "hotpotqa": ("multi-hop", "dev"),
    "2wikimultihopqa": ("multi-hop", "dev"),
    "musique": ("multi-hop", "dev"),
    "bamboogle": ("multi-hop", "test"),
}
TRAIN_SETS = ("nq", "hotpotqa")


@dataclass(frozen=True)
class QATask:
    """One question with every accepted answer.

    `kind` groups results: the dataset name for real sets, the question kind (single_hop, bridge,
    bridge3, comparison) for generated ones. `plan` is how the generated questions' expert solves
    them (empty for real sets).
    """

    question: str
    golds: tuple[str, ...]
    source: str
    kind: str
    id: str = ""
    plan: tuple = ()


def as_asked(question: str) -> str:
    """The question as Search-R1 asks it: stripped, with a "?" added when it does not end with one."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def check_dataset(name: str) -> str:
    if name not in DATASETS:
        raise ValueError(f"unknown QA dataset {name!r}; known: {', '.join(DATASETS)}")
    return name


def load_flashrag(path: str | os.PathLike, dataset: str, limit: int = 0) -> list[QATask]:
    """Questions of a FlashRAG-format JSONL file, in file order (the first `limit` when > 0), each asked
    as Search-R1 asks it (`as_asked`)."""
    check_dataset(dataset)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{dataset} file not found: {path}")
    tasks: list[QATask] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object")
            question = record.get("question")
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{where}: key 'question' must be a non-empty string")
            golds = record.get("golden_answers")
            if isinstance(golds, str):
                golds = [golds]
            if not isinstance(golds, list) or not golds or not all(isinstance(g, str) for g in golds):
                raise ValueError(f"{where}: key 'golden_answers' must be a non-empty list of strings")
            rid = str(record.get("id", f"{dataset}_{n - 1}"))
            tasks.append(QATask(as_asked(question), tuple(golds), dataset, dataset, rid))
            if limit and len(tasks) >= limit:
                break
    if not tasks:
        raise ValueError(f"{dataset} file {path} holds no questions")
    return tasks


def dataset_file(root: str | os.PathLike, dataset: str, split: str | None = None) -> Path:
    """`<root>/<dataset>/<split>.jsonl` as FlashRAG lays its datasets out (split: Search-R1's eval split)."""
    check_dataset(dataset)
    return Path(root) / dataset / f"{split or DATASETS[dataset][1]}.jsonl"
