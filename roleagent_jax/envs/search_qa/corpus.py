"""Passages, the retriever interface, and how retrieved passages are shown to the agent.

A corpus is JSONL in the layout of the Search-R1 / FlashRAG Wikipedia dumps: one object per line with
"contents" = '"Title"\\ntext' (objects with separate "title" and "text" fields are read too) and an
optional "id". The information block the agent sees numbers the passages as those projects do.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Passage:
    title: str
    text: str
    id: str = ""
    score: float | None = None

    @property
    def contents(self) -> str:
        """The corpus form: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_contents(cls, contents: str, id: str = "", score: float | None = None) -> Passage:
        """Split '"Title"\\ntext'; a first line without quotes is still the title, a single line is text."""
        head, sep, rest = contents.partition("\n")
        if not sep:
            return cls("", contents.strip(), id, score)
        return cls(head.strip().strip('"'), rest.strip(), id, score)

    @classmethod
    def from_record(cls, record: dict, where: str = "record") -> Passage:
        """A corpus or server record: {"contents"} or {"title", "text"} (plus an optional "id")."""
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        pid = str(record.get("id", ""))
        if isinstance(record.get("contents"), str):
            return cls.from_contents(record["contents"], pid)
        if isinstance(record.get("text"), str):
            return cls(str(record.get("title", "")), record["text"].strip(), pid)
        raise ValueError(f"{where}: a passage needs a 'contents' string or 'title' and 'text' fields")


class Retriever(Protocol):
    """Anything that returns, for each query, its top passages (best first, at most topk)."""

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]: ...


def load_corpus(path: str | os.PathLike) -> list[Passage]:
    """Every passage of a JSONL corpus, in file order (ids default to the line number)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    passages = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            p = Passage.from_record(record, f"{path}:{n}")
            passages.append(p if p.id else Passage(p.title, p.text, str(n - 1)))
    if not passages:
        raise ValueError(f"corpus file {path} holds no passages")
    return passages


def write_corpus(passages: Sequence[Passage], path: str | os.PathLike) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n")


NO_RESULTS = "No results."


def format_information(passages: Sequence[Passage], quoted_titles: bool = False) -> str:
    """The retrieved passages as the agent reads them, one per line: 'Doc 1(Title: "T") text' with
    `quoted_titles` (Search-R1 prints the corpus's first line, a quoted title), else 'Doc 1(Title: T)
    text'."""
    if not passages:
        return NO_RESULTS
    quote = '"' if quoted_titles else ""
    return "\n".join(f"Doc {i}(Title: {quote}{p.title}{quote}) {p.text}" for i, p in enumerate(passages, 1))


_DOC = re.compile(r'^Doc \d+\(Title: ("[^"]*"|.*?)\) (.*)$')


def parse_information(text: str) -> list[Passage]:
    """The passages of an information text (the inverse of `format_information`; other lines ignored)."""
    text = text.replace("<information>", "\n").replace("</information>", "\n")
    lines = (_DOC.match(line.strip()) for line in text.splitlines())
    return [Passage(m.group(1).strip('"'), m.group(2)) for m in lines if m]
