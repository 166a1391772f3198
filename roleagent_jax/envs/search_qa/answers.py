"""Exact match the way the QA literature scores it, and the final answer of a response.

`normalize_answer` is SQuAD's normalisation (lower case, ASCII punctuation removed, the articles a / an
/ the dropped, whitespace collapsed), so figures compare with published ones. Two additions that only
matter at the margins: text is first put in Unicode NFC (a decomposed "é" equals a composed one), and
a prediction that normalises to nothing never matches (a gold such as "The" must not reward an empty
answer during RL).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_ANSWER_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation (after NFC): lower, strip ASCII punctuation, drop articles, collapse spaces."""
    text = unicodedata.normalize("NFC", text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golds: str | Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0.

    A single string is one gold answer (not a list of characters); None or an empty prediction scores 0.
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    if not pred:
        return 0.0
    if isinstance(golds, str):
        golds = [golds]
    return float(any(pred == normalize_answer(g) for g in golds if isinstance(g, str)))


def extract_answer(response: str | None) -> str | None:
    """The content of the last complete <answer>...</answer> block, stripped; None when there is none.

    "Complete" means opened and then closed: the block opens at the last opening tag that some closing tag
    follows and ends at the first closing tag after it, so neither a stray earlier "<answer>" nor a
    stray later "</answer>" changes which text is the answer.
    """
    if not isinstance(response, str):
        return None
    closes = list(_ANSWER_CLOSE.finditer(response))
    if not closes:
        return None
    opens = list(_ANSWER_OPEN.finditer(response, 0, closes[-1].start()))
    if not opens:
        return None
    start = opens[-1].end()
    end = next(c.start() for c in closes if c.start() >= start)
    return response[start:end].strip()
