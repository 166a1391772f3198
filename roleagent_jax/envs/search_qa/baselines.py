"""Reference policies without a model: a random one and one that answers without searching.

Both are lower bounds for the generated questions. The random policy searches or answers with random
words of the question and of what it has read (with the caller's generator: evaluation seeds it by
(seed, task, turn), so a panel replays exactly). The no-search policy answers at once with the first name the question mentions: for a
comparison that is one of the two options, right half the time, and that is the only kind it can get
right.
"""

from __future__ import annotations

import random
import re

_WORD = re.compile(r"[A-Za-z0-9']+")
_OPTIONS = re.compile(r",\s*(.+?)\s+or\s+(.+?)\?\s*$")
_NAME = re.compile(r"\b[A-Z][a-z0-9']+(?:\s+(?:of|at|in)?\s*[A-Z][a-z0-9']+)*")


def random_response(rng: random.Random, question: str, observation: str) -> str:
    """Search (half the time) or answer with 1-3 random words of the question and the last observation."""
    words = _WORD.findall(question) + _WORD.findall(observation)
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) if words else "unknown"
    return f"<search>{text}</search>" if rng.random() < 0.5 else f"<answer>{text}</answer>"


def first_name_in(question: str) -> str:
    """The first option of a comparison ("..., A or B?"), else the first capitalised name after word one."""
    m = _OPTIONS.search(question)
    if m:
        return m.group(1).strip()
    names = _NAME.findall(question.split(" ", 1)[1] if " " in question else question)
    return names[0].strip() if names else "unknown"


def nosearch_response(question: str) -> str:
    return f"<answer>{first_name_in(question)}</answer>"
