"""What a sampler call is asked and what it returns: plain records, apart from the sampler, so the call's
planner (`plan`) and the sampler read the same request type without importing each other."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

FINISH_REASONS = ("running", "eos", "stop", "length", "paused")  # index = the code the decode loop writes


@dataclass
class SampleRequest:
    """One generation request. `stop` strings end the response; the matched stop stays in the text.

    `group`: any hashable key (e.g. the task group's id). Requests of one call with the same role and
    group share the KV of their prompts' longest common token prefix (computed once, stored once);
    None (the default) generates the row on its own. Greedy output does not depend on it; sampled
    output keeps its distribution, but a row's random draws follow its place in the call's layout.

    `background`: the row uses only capacity the call's foreground rows leave idle. It joins the call
    only if it fits in the spare rows of their batch bucket and in their prompt bucket (so it never
    widens the call), and decodes only while a foreground row of the call is still decoding (so it
    never takes more steps than they do), whichever chunk (`plan`) each runs in.
    Cut off, or left out, it returns what it generated (possibly nothing) with finish_reason
    "paused", for a later call to continue (its prompt plus those tokens, the remaining budget). A call
    of background rows only runs them to the end.

    `score_tokens`: the prompt's last tokens to score (tokens the caller forced: a branch's opener, a step
    played whole), returned as `SampleResult.prompt_logprobs`. They stay in the row's own prompt, never
    in a shared prefix. With `max_new_tokens` 0 the request only scores them and generates nothing.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    role: str = "agent"
    group: Hashable | None = None
    background: bool = False
    score_tokens: int = 0


@dataclass
class SampleResult:
    """What one request produced.

    token_ids: generated ids, up to and including the token that ended generation (the EOS id itself,
        or the token that completed a stop string), never anything after it.
    logprobs: log_softmax(raw logits)[token] per generated id: the policy at temperature 1 without
        top-k/top-p truncation, which is what the PPO ratio against the training forward needs.
    text: decoded text; with a stop it ends exactly at the end of the first stop string (the stop is
        kept, e.g. "...</action>", so an action parser sees the closing tag); without the EOS token.
    finish_reason: "eos" | "stop" | "length" | "paused" (a background row cut off, see SampleRequest).
    prompt_logprobs: the request's `score_tokens` last prompt tokens, scored like `logprobs` (each given
        the tokens before it), in prompt order.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    role: str
    prompt_logprobs: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class SamplingParams:
    """Decoding rule. temperature == 0 means greedy; top_k == 0 and top_p == 1 disable truncation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0
