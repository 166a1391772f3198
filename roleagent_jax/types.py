"""Plain data records shared by the rollout, WIA, AIW, evaluation and the environment families.

Kept free of JAX and of every other package module, so environment workers and host-side analysis
import them cheaply and the families' failure analysers need nothing above this floor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

UNKNOWN = "unknown"
"""The failure type of an answer or trajectory that fits none of a family's types."""


@dataclass
class Step:
    """One agent turn: what the agent saw, what it said, and what happened."""

    observation: str  # raw environment text the agent acted on
    admissible: list[str] | None  # admissible actions at that observation (None for free-form families)
    response: str  # the model's full response text
    action: str | None  # the command the model wrote, admissible or not; None when nothing parsed
    valid: bool  # False for an unparsable / inadmissible response
    reward: float  # environment reward for this step
    next_observation: str  # observation after the action
    done: bool = False
    # the response held a well-formed command (admissible or not): only False = no parsable action, so
    # analysers tell a format error from a command the environment refused
    parsed: bool = False


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are played and prompted: shared by the rollout and WIA's predictor. The values (and
    their defaults) are the config's keys named beside each field: `from_config`."""

    max_steps: int  # env.max_steps
    history_k: int  # env.history_k
    max_prompt_tokens: int  # rollout.max_prompt_tokens
    max_response_tokens: int  # rollout.max_response_tokens
    wia_mode: str  # wia.mode: separate | inline | off
    wia_horizon: int  # wia.horizon
    wia_fraction: float  # wia.fraction
    wia_max_tokens: int  # wia.max_tokens
    branch_at: int  # rollout.branch_at: a task group's slots share their first steps (0: none)
    branch_openers: bool  # rollout.branch_openers: branch j starts with the family's opener j
    expert_branch: bool  # rollout.expert_branch: a group's last branch plays the expert's step
    train_openers: bool  # rollout.train_openers: forced tokens are trained, so the sampler scores them
    expert_slots: int  # rollout.expert_slots: how many of a group's last branches do
    expert_when: str  # rollout.expert_when: always | no_win (only in groups none of whose own won)

    @classmethod
    def from_config(cls, config) -> RolloutSettings:
        """The settings of a run's config (a ConfigDict with the declared keys, e.g. `CONFIG.build()`)."""
        c = config
        return cls(
            max_steps=c.env.max_steps,
            history_k=c.env.history_k,
            max_prompt_tokens=c.rollout.max_prompt_tokens,
            max_response_tokens=c.rollout.max_response_tokens,
            wia_mode=c.wia.mode,
            wia_horizon=c.wia.horizon,
            wia_fraction=c.wia.fraction,
            wia_max_tokens=c.wia.max_tokens,
            branch_at=c.rollout.branch_at,
            branch_openers=c.rollout.branch_openers,
            expert_branch=c.rollout.expert_branch,
            train_openers=c.rollout.train_openers,
            expert_slots=c.rollout.expert_slots,
            expert_when=c.rollout.expert_when,
        )


@dataclass
class Row:
    """One sampled answer as a training row: its token ids, the sampler's log-probs, and what the
    advantages need (the episode, group, step, the hashed anchor state, reward and validity).

    `forced_tokens`: how many leading response tokens were given, not sampled (a branch's opener,
    `rollout.branch_openers`, or the expert's step); they condition the rest and carry no loss unless
    `rollout.train_openers`. `forced_scored`: the sampler scored them (`rollout.train_openers`), so
    their `logprobs` are the policy's; else those are 0. `expert_tokens`: how many of them the family's
    expert played (`rollout.expert_branch`: the whole forced step; 0 on the policy's own rows), the
    tokens a guided loss (`loss.guided`) trains."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    traj_id: int
    group_id: int
    task_id: int
    step_index: int
    anchor_hash: int
    reward: float
    valid: bool
    done: bool
    anchor: str = ""  # the anchor itself, for similarity clustering of step groups
    state: str = ""  # the family's state identity at that step ("" where it has none): advantage.anchor
    forced_tokens: int = 0
    forced_scored: bool = False
    expert_tokens: int = 0


@dataclass
class Trajectory:
    """One episode of one task by one rollout."""

    task_id: int  # index into the task pool
    task_type: str  # one of the family's task types, e.g. "pick_clean_then_place_in_recep"
    goal: str  # the goal sentence ("put a clean apple in fridge.")
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    env_failed: bool = False  # the environment worker crashed or timed out: episode counted as failed
    env_error: str = ""  # why the environment failed (the worker's exception or timeout), when it did
    group_id: int = -1  # task group (one task x G rollouts) inside an iteration
    traj_id: int = -1  # unique within an iteration
    score: float | None = None  # the family's graded outcome of the last step, where it has one

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))


@dataclass
class FailureReport:
    """One analysed failure. ``critical_step`` is 1-based, as steps are numbered in the analysis prompt."""

    failure_type: str = UNKNOWN
    detail: str = ""
    critical_step: int | None = None
    lesson: str = ""
    query: str = ""
    raw: str = ""
    source: str = "llm"  # "llm" | "heuristic"

    @property
    def usable(self) -> bool:
        """True when the report says something retrieval can use (a known type, a query or a lesson)."""
        return self.failure_type != UNKNOWN or bool(self.query.strip()) or bool(self.lesson.strip())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FailureReport:
        keys = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in keys})
