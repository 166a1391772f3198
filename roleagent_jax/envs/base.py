"""The environment contract: what every scenario family (ALFWorld, WebShop, search QA, ...) provides.

Generic code (rollout, evaluation, warm start, trainer, WIA, AIW) talks to a family only through the
names in this module, so adding a family is one package under `roleagent_jax/envs/<family>/` plus one
`registry.register(...)` call. The pieces:

- `Task`: one playable task (an id, its type, the goal sentence, a family payload, a known plan).
- `Observation`: what one `reset` or `step` returns (text, GiGPO anchor, admissible actions, reward,
  done, won, an optional family score, the expert's plan when asked for, free-form info).
- `Env`: the engine adapter protocol, `reset(task, expert=False)` and `step(action)`; instances live
  in worker processes (see `envs/pool.py`) and never import JAX.
- `TaskPool`: an ordered list of tasks; a task's index in it is the task id everything else uses
  (the AIW sampler draws indices, `EnvPool.reset` plays `pool.tasks[i]`). `PoolRequest`: the
  arguments of one `Family.task_pool` call, as the family's pool hooks see them.
- `Family`: the base class a family subclasses: its name and task types, how to build its env and
  its task pools, the agent's prompt and action parser, its own rates of what evaluated episodes did,
  the WIA predictor framing and the AIW pieces (failure taxonomy, heuristic analyser, goal abstraction
  for retrieval).
- The registry (`envs/registry.py`): `register`, `registered`, `get_family`; the WIA predictor's
  framing and question (`envs/predictor_prompt.py`).

This module imports nothing heavy (no JAX, no engine): workers and tests import it freely.
"""

from __future__ import annotations

import copy
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from roleagent_jax.envs.predictor_prompt import PredictorFraming, build_predictor_prompt
from roleagent_jax.envs.text import MAX_ACTION_CHARS
from roleagent_jax.types import FailureReport, Trajectory

History = Sequence[tuple[str, str]]
"""An episode's earlier (observation, action) pairs, oldest first, as the prompt builders receive them."""

Admissible = Sequence[str] | None
"""The actions the env accepts at an observation; None for free-form families (any text is an action)."""


# ------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Task:
    """One task a family can play. Picklable: the pool sends it to the worker that plays it.

    id           stable identifier, unique in its pool (ALFWorld: the game file's path).
    type         the task type, one of the family's `task_types` (success is reported per type).
    goal         the goal sentence exactly as the agent's prompt states it.
    payload      whatever the family's env needs to start the task (a game file, a product goal, a
                 question with its gold answers); generic code never looks inside.
    expert_plan  a known winning action sequence (generated tasks keep their generator's), or None.
                 The warm start replays it instead of asking the env's expert step by step.
    """

    id: str
    type: str
    goal: str
    payload: Any = None
    expert_plan: tuple[str, ...] | None = None


@dataclass
class Observation:
    """What the env returns from `reset` and `step`. Picklable (it crosses the worker pipe).

    text         what the agent reads (the raw engine text; the prompt builder may clean it).
    anchor       the observation GiGPO's reference keys its step groups by: two observations with equal
                 anchors in one task group count as one state (ALFWorld: the raw observation text).
    state        the identity of the environment state where the family knows it ("" otherwise), the
                 step groups' key under `advantage.anchor=state`: unlike the text, it tells the same room
                 with another inventory apart, and an action that changes nothing keeps it.
    admissible   the actions the env accepts now, or None for free-form families (any text is an action;
                 the parser then validates format only).
    reward       the step's task reward (0.0 after reset).
    done         the episode is over (won, lost, or out of steps); stepping it again changes nothing.
    won          the task is solved (success, the quantity every summary reports).
    score        an optional graded outcome of the family (WebShop's purchase score, QA's exact match);
                 None where the family has none.
    expert_plan  the expert's remaining plan from this state when the episode was reset with
                 `expert=True` (the first entry is the expert's next action); None otherwise.
    failed       set by the worker pool only: the env crashed or timed out and the episode is lost
                 (counted as failed, never as an agent failure). Families leave it False.
    info         free-form family extras for logs and tests (ALFWorld: step count, game file); generic
                 code never depends on its keys.
    """

    text: str
    anchor: str
    admissible: list[str] | None = None
    reward: float = 0.0
    done: bool = False
    won: bool = False
    score: float | None = None
    expert_plan: list[str] | None = None
    failed: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    state: str = ""


@runtime_checkable
class Env(Protocol):
    """One episode at a time of one family, in a worker process (no JAX).

    `reset(task, expert=False)` starts `task` from its initial state; with `expert=True` every
    observation of this episode carries `expert_plan` (families without an expert ignore the flag).
    `step(action)` applies one action text (the parsed action, or `Family.unparsed_action` of the raw
    response) and returns the next observation; after `done`, stepping returns the final observation
    again with reward 0. An env ends an episode itself after the `max_steps` it was built with.
    Raising from either call marks that one episode as failed; the pool keeps going.
    """

    def reset(self, task: Task, expert: bool = False) -> Observation: ...

    def step(self, action: str) -> Observation: ...


@dataclass
class TaskPool:
    """Tasks in a fixed order; a task's index is its task id for sampling, rollouts and AIW.

    `source` says where the tasks came from (a folder, a generated set) for messages and reports.
    """

    tasks: list[Task]
    source: str = ""

    def __post_init__(self) -> None:
        self.tasks = list(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> Task:
        return self.tasks[index]

    @property
    def task_types(self) -> list[str]:
        """The type of every task, in pool order."""
        return [t.type for t in self.tasks]

    @property
    def goals(self) -> list[str]:
        """The goal sentence of every task, in pool order."""
        return [t.goal for t in self.tasks]

    @property
    def expert_plans(self) -> dict[int, list[str]]:
        """task index -> known winning plan, for the tasks that have one."""
        return {i: list(t.expert_plan) for i, t in enumerate(self.tasks) if t.expert_plan is not None}

    def type_counts(self) -> dict[str, int]:
        """How many tasks of each type the pool holds."""
        return dict(Counter(self.task_types))

    def subset(self, ids: Sequence[int]) -> TaskPool:
        """The tasks at `ids`, in that order (their new indices are 0..len(ids)-1)."""
        return TaskPool([self.tasks[int(i)] for i in ids], self.source)


@dataclass(frozen=True)
class PoolRequest:
    """The arguments of one `Family.task_pool` call, as the family's pool hooks receive them: `options`
    already resolved over `gen_options`, so a hook reads every setting as a key."""

    split: str
    data_dir: str | Path | None = None
    gen_dir: str | Path | None = None
    n: int = 0
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    on_corrupt: str = "fail"


# ------------------------------------------------------------------------------------------ family


class Family:
    """Everything generic code needs from one scenario family; subclass it and `register` an instance.

    Instances must be picklable by reference (a module-level class whose instance attributes pickle):
    worker processes unpickle the family and call `start_worker()` then `make_env(...)`. A family
    defined in a test module works too, provided that module imports no JAX at its top level (the
    worker imports it to unpickle the family).

    Class attributes to set: `name`, `task_types`; usually also `action_stop`, `empty_action`,
    `has_expert`, `generated_splits`, `gen_options`, `predictor_framing`, `analysis_intro`,
    `failure_types` (+ `failure_keywords`), `pattern_keywords`. Methods to implement: `make_env`,
    `generated_tasks` and/or `data_tasks` (behind `task_pool`), `agent_prompt`, `parse_action`; override
    the others where the defaults do not fit.
    """

    name: ClassVar[str] = ""
    """Registry key and the value of `config.env.name` ("alfworld")."""

    task_types: ClassVar[tuple[str, ...]] = ()
    """Canonical task types in report order: success summaries list types in this order."""

    action_stop: ClassVar[str] = "</action>"
    """The stop string that ends an agent answer (the sampler stops there; it may be cut off)."""

    action_openers: ClassVar[tuple[str, ...]] = ()
    """The strings an answer of each action kind starts with (search QA: "<search>", "<answer>"), or ()
    where the family has none. With `rollout.branch_openers` the branches of a task group start their
    answers with these in turn, so its step groups compare every kind of action."""

    empty_action: ClassVar[str] = ""
    """What the env receives when the response is unparsable and, stripped, empty (ALFWorld: "look")."""

    has_expert: ClassVar[bool] = False
    """Whether `Env.reset(task, expert=True)` fills `Observation.expert_plan` (warm start, --policy=expert)."""

    score_name: ClassVar[str] = "score"
    """What `Observation.score` measures, as summaries name it (search QA: "em", its exact match)."""

    generated_splits: ClassVar[tuple[str, ...]] = ()
    """Split names whose tasks the family generates itself (no download), e.g. ("gen_seen", "gen_unseen").
    The trainer gives each (split, purpose) its own folder, size and seed; other splits are real data."""

    data_splits: ClassVar[tuple[str, ...] | None] = None
    """Names of the family's real data splits, e.g. ("train", "valid_seen"), so a misspelt split fails at
    start-up; see `known_splits`. None: the family does not list them and any name reaches `task_pool`."""

    gen_options: ClassVar[Mapping[str, Any]] = {}
    """The family's own settings with their defaults: generation (ALFWorld: room sizes) and how it plays
    (its protocol, prompt style, validity rule). The trainer passes `config.env.<name>` (when the config
    has that subtree) as `options` to `task_pool` and to `configured`. The defaults are the reference
    runs' choices, so a config that names none plays the published protocol."""

    predictor_framing: ClassVar[PredictorFraming] = PredictorFraming()
    """How WIA's predictor prompt names the world; see `predictor_prompt`."""

    analysis_intro: ClassVar[str] = "You review a failed attempt at a task and explain why it failed."
    """First line of the AIW analysis prompt (the policy as its own failure analyst)."""

    failure_types: ClassVar[Mapping[str, str]] = {}
    """AIW failure taxonomy: type name -> one-line gloss (shown in the analysis prompt). `unknown` is
    added by AIW itself and must not be listed."""

    failure_keywords: ClassVar[tuple[tuple[str, str], ...]] = ()
    """(phrase, type name) pairs: words small models use for a type instead of its name. Checked in
    order after exact and fuzzy name matching when an analysis answer is normalised."""

    pattern_keywords: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    """task type -> distinctive words of its pattern, for AIW's fuzzy retrieval (a query naming "heat"
    or "microwave" pulls heat-then-place tasks). Multi-word entries match as phrases. Types without an
    entry match on their pattern name."""

    # -------------------------------------------------------------- settings

    def configured(self, options: Mapping[str, Any] | None) -> Family:
        """A copy of this family that plays with `options` (over `gen_options`; an unknown key or a bad
        value raises ValueError naming it). Prompts, parser and envs read `self.options`, and the copy
        pickles with them, so one run's settings reach every worker."""
        resolved = self.resolve_options(options)
        self.check_options(resolved)
        family = copy.copy(self)
        family._options = resolved
        return family

    @property
    def options(self) -> dict[str, Any]:
        """The settings this family plays with: those given to `configured`, else the defaults."""
        return dict(getattr(self, "_options", None) or self.gen_options)

    # -------------------------------------------------------------- environment (worker side)

    def start_worker(self) -> None:
        """Called once in each env worker process before its first `make_env` (process-wide set-up, such
        as ALFWorld's textworld parser memo). Default: nothing."""

    def make_env(self, max_steps: int) -> Env:
        """A fresh env that ends each episode after at most `max_steps` steps. Runs in a JAX-free worker
        process; one env per pool slot, reset many times."""
        raise NotImplementedError(f"family {self.name!r} does not implement make_env")

    # -------------------------------------------------------------- tasks

    def task_pool(
        self,
        split: str,
        *,
        data_dir: str | Path | None = None,
        gen_dir: str | Path | None = None,
        n: int = 0,
        seed: int = 0,
        options: Mapping[str, Any] | None = None,
        on_corrupt: str = "fail",
    ) -> TaskPool:
        """The tasks of `split`, in a fixed order.

        Real data splits read `data_dir` (None: the family's default location, e.g. an environment
        variable) and raise FileNotFoundError naming what is missing and how to get it. Generated splits
        (`generated_splits`) write or reuse `n` tasks made with `seed` and `options` (the family's
        `gen_options` keys; unknown keys raise ValueError) under `gen_dir`: the same arguments give the
        same tasks. An unknown split raises ValueError listing the known ones. A real split's task file
        that cannot be read raises ValueError naming it (`on_corrupt="fail"`) or is left out with a
        warning naming it (`"skip"`).

        Families implement `generated_tasks` and `data_tasks`; this resolves the options and picks one.
        """
        request = PoolRequest(split, data_dir, gen_dir, n, seed, self.resolve_options(options), on_corrupt)
        if split in self.generated_splits:
            return self.generated_tasks(request)
        return self.data_tasks(request)

    def generated_tasks(self, request: PoolRequest) -> TaskPool:
        """The tasks of a generated split (one of `generated_splits`); see `task_pool`."""
        raise NotImplementedError(f"family {self.name!r} does not implement generated_tasks")

    def data_tasks(self, request: PoolRequest) -> TaskPool:
        """The tasks of any other split, read from real data; see `task_pool`. Default: no real data, so
        the split is unknown (ValueError listing the known ones)."""
        known = self.known_splits() or self.generated_splits
        raise ValueError(f"unknown {self.name} split {request.split!r}; known: {', '.join(known)}")

    def known_splits(self) -> tuple[str, ...] | None:
        """Every split name `task_pool` accepts (data splits, then generated ones), checked against the
        config before any work starts. Default: `data_splits` + `generated_splits`, or None (no check)
        when the family leaves `data_splits` unset."""
        if self.data_splits is None:
            return None
        return tuple(self.data_splits) + tuple(self.generated_splits)

    def check_split(self, split: str) -> None:
        """ValueError naming `split` and the valid ones when the family cannot know it, before any work;
        for families whose splits are no closed list (real data sets named on the command line).
        Default: nothing (`known_splits` is checked where there is one)."""

    def resolve_options(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """`gen_options` updated with `options`; ValueError naming any key the family does not know."""
        unknown = sorted(set(options or {}) - set(self.gen_options))
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for environment {self.name!r}; known: {sorted(self.gen_options)}"
            )
        return {**self.gen_options, **dict(options or {})}

    def check_data(self, split: str, data_dir: str | Path | None = None) -> None:
        """Raise FileNotFoundError (naming what is missing and how to get it) when the real split's data
        is not where `task_pool` would read it, without loading a task: start-up checks it before any
        game is played. Default: nothing to check."""

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise ValueError naming the option and value when the resolved `options` are unusable, so a
        run fails at start-up rather than when it first builds tasks. Default: any known key is fine."""

    # -------------------------------------------------------------- agent

    def agent_prompt(
        self, goal: str, history: History, observation: str, admissible: Admissible, step: int, history_k: int
    ) -> str:
        """The agent's user message at `step` (0-based): the goal, the last `history_k` of the earlier
        (observation, action) pairs in `history` (oldest first; the builder slices), the current
        observation text and the admissible actions (None: free-form). The answer format it asks for
        must end with `action_stop`."""
        raise NotImplementedError(f"family {self.name!r} does not implement agent_prompt")

    def parse_action(self, response: str, admissible: Sequence[str] | None) -> tuple[str | None, bool]:
        """(action, valid) from a model response; never raises.

        valid=True: the answer passes the family's validity rule: the reference runs' format rule (the
        answer's blocks are well formed, whatever the env makes of the action) or, where a family offers
        it, "a well-formed action that the env accepts" (in `admissible` when given). An action found in
        `admissible` comes back in the list's own spelling; anything unparsable returns (None, False)."""
        raise NotImplementedError(f"family {self.name!r} does not implement parse_action")

    def format_action(self, action: str) -> str:
        """A response text that `parse_action` reads back as `action` (expert targets for the warm
        start, the expert and random evaluation policies). Default: `<action>{action}</action>`."""
        return f"<action>{action}</action>"

    def random_response(self, rng: random.Random, goal: str, observation: Observation) -> str:
        """The random baseline's response for one turn (evaluate --policy=random), drawn with `rng`: an
        admissible action in the answer format, or `empty_action` when there is no list. Free-form
        families override it with random text of their own format."""
        admissible = observation.admissible
        return self.format_action(rng.choice(admissible) if admissible else self.empty_action)

    def unparsed_action(self, response: str) -> str:
        """What the env receives when `parse_action` found no action: the response stripped and cut to
        MAX_ACTION_CHARS characters, or `empty_action` when nothing is left. The step is recorded as
        invalid either way."""
        return response.strip()[:MAX_ACTION_CHARS] or self.empty_action

    # -------------------------------------------------------------- evaluation

    def behaviour(self, trajs: Sequence[Trajectory], pool: TaskPool) -> dict[str, float]:
        """The evaluation summary's `behaviour`: name -> a rate or a count of what the episodes did (task
        `pool[traj.task_id]`; search QA: second searches where one is needed and elsewhere). Default: {}."""
        return {}

    def warnings(self, trajs: Sequence[Trajectory]) -> list[str]:
        """What the episodes show wrong with the environment, not the agent, one line each (search QA: a
        retriever that found nothing for any query). Default: none."""
        return []

    # -------------------------------------------------------------- WIA

    def predictor_prompt(
        self,
        goal: str,
        history: Sequence[tuple[str, str]],
        observation: str,
        action: str,
        horizon: int,
    ) -> str:
        """WIA's separate-mode prompt for one step: the model predicts the next `horizon` observations
        after `action`. Default: WIA's generic prompt in this family's `predictor_framing`."""
        return build_predictor_prompt(
            goal, history, observation, action, horizon, framing=self.predictor_framing
        )

    # -------------------------------------------------------------- AIW

    def analyse_failure(self, traj: Trajectory, max_steps: int) -> FailureReport:
        """AIW's heuristic analyser: label a failed trajectory with one of `failure_types` (or `unknown`),
        the 1-based critical step, and a lesson and retrieval query that name the task pattern, never
        the surface object. Used when the policy does not analyse (aiw.analyser=heuristic) and when its
        analysis is unusable. Default: `unknown` with the pattern name as query."""
        p = self.pattern_name(traj.task_type)
        return FailureReport(
            detail="episode won" if traj.won else "no rule matched",
            lesson=f"In {p} tasks, plan the steps the task needs before acting.",
            query=f"{p}: failed",
            source="heuristic",
        )

    def abstract_goal(self, goal: str, task_type: str) -> str:
        """The goal with its surface entities replaced by placeholders ("put a clean X in Y"), so
        retrieval compares tasks by pattern. Default: the goal lower-cased, whitespace collapsed."""
        return re.sub(r"\s+", " ", goal.lower()).strip()

    def pattern_name(self, task_type: str) -> str:
        """A short name of the task type's pattern ("clean then place"). Default: the type's words."""
        return task_type.replace("_", " ").strip() or "task"

    def pattern_text(self, task_type: str) -> str:
        """A one-line description of the pattern (retrieval's task descriptions). Default: the name."""
        return self.pattern_name(task_type)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
