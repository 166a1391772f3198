"""What one agent turn asks for: a search, an answer, or nothing usable.

The agent writes free text; its turn is decided by the first complete <search>...</search> or
<answer>...</answer> block (the sampler stops at the first closing tag, so normally there is one).
A turn without such a block, with an empty or over-long content, or with another tag inside the
block is invalid: the environment answers it with a format reminder. The reference runs' rule
(`one_action`) also marks a turn invalid when it opens both tags, or either twice; the turn found is
still played.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEARCH, ANSWER = "search", "answer"
MAX_QUERY_CHARS = 300
MAX_ANSWER_CHARS = 200
_BLOCK = re.compile(r"<\s*(search|answer)\s*>(.*?)<\s*/\s*\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<\s*/?\s*[a-zA-Z_]+\s*>")
_OPENS = {kind: re.compile(rf"<{kind}>", re.IGNORECASE) for kind in (SEARCH, ANSWER)}
VALIDITY_RULES = ("format", "block")  # the reference's rule | the first complete block decides alone


@dataclass(frozen=True)
class Turn:
    """A parsed turn: kind "search" / "answer" with its content, or kind None with the reason."""

    kind: str | None
    content: str = ""
    error: str = ""

    @property
    def valid(self) -> bool:
        return self.kind is not None

    @property
    def action(self) -> str | None:
        """The turn in canonical form ("<search>query</search>"), which parses back to the same turn."""
        return f"<{self.kind}>{self.content}</{self.kind}>" if self.kind else None


def parse_turn(response: str | None) -> Turn:
    """Parse a model response into a Turn; never raises."""
    if not isinstance(response, str):
        return Turn(None, error="no response")
    m = _BLOCK.search(response)
    if m is None:
        return Turn(None, error="no complete <search> or <answer> block")
    kind, raw = m.group(1).lower(), m.group(2)
    if _TAG.search(raw):
        return Turn(None, error=f"another tag inside the <{kind}> block")
    content = " ".join(raw.split())
    if not content:
        return Turn(None, error=f"empty <{kind}> block")
    limit = MAX_QUERY_CHARS if kind == SEARCH else MAX_ANSWER_CHARS
    if len(content) > limit:
        return Turn(None, error=f"<{kind}> block longer than {limit} characters")
    return Turn(kind, content)


def one_action(response: str) -> bool:
    """The reference's check: the response opens <search> or <answer>, not both, and neither twice."""
    searches, answers = (len(_OPENS[k].findall(response)) for k in (SEARCH, ANSWER))
    return not (searches and answers) and searches <= 1 and answers <= 1
