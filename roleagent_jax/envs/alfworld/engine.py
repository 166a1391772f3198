"""ALFWorld on its real engine: TextWorld's PDDL environment under alfworld's own wrappers.

One `AlfWorldEnv` plays one game at a time and can be reset to any game file. The RL loop resets the
same few games thousands of times, so everything that depends only on a game file is computed once
per process and kept: the parsed JSON, the grammar (`GameLogic`) and Fast Downward's PDDL -> SAS
translation, which is most of the cost of a plain `PddlEnv.reset`. A reset then only reloads the SAS
task into the planner library and renders the intro text. Games differ in their grammar only by the
task sentence, so one parse serves them all; and textworld's rule-string parsers, which re-parse the
same strings on every step, can be made to remember their results (`memoize_textworld_parsers`, steps
about 3x faster): the family turns that on when a worker process starts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import fast_downward
import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
from textworld.core import GameState
from textworld.envs.pddl import PddlEnv, textgen
from textworld.envs.pddl import logic as pddl_logic
from textworld.envs.pddl.textgen import ContextSensitiveGrammar
from textworld.logic import Proposition, Rule, Type, Variable

from roleagent_jax.envs.alfworld.expert import PLAN_CACHE, PlannerExpert
from roleagent_jax.envs.alfworld.games import (
    JSON_CACHE,
    LRU,
    WIN_REWARD,
    goal_from_observation,
    read_json,
    task_type_of,
)
from roleagent_jax.envs.base import Observation, Task

EXPERT_TYPES = ("planner", "handcoded")

_PLAIN_SYMBOLS = textgen._parse_and_convert  # textworld's own parsers, kept to restore them
_PLAIN_QUERY = Rule.__dict__["parse_conjunctive_query"]
_SYMBOLS_CACHE: dict = {}
_QUERY_CACHE: dict = {}


def _cached_symbols(*args, **kwargs) -> list:
    key = (args, tuple(sorted(kwargs.items())))
    if key not in _SYMBOLS_CACHE:
        _SYMBOLS_CACHE[key] = _PLAIN_SYMBOLS(*args, **kwargs)
    return copy.deepcopy(_SYMBOLS_CACHE[key])  # derivation sets each symbol's context


def _cached_query(expr: str) -> Rule:
    if expr not in _QUERY_CACHE:
        _QUERY_CACHE[expr] = _PLAIN_QUERY.__get__(None, Rule)(expr)
    return _QUERY_CACHE[expr]  # only read: one object serves every call


def memoize_textworld_parsers(enabled: bool = True) -> None:
    """Make textworld's two rule-string parsers remember what they parsed, in this process (or undo it).

    Every step renders its feedback through the grammar, which re-parses the same rule strings with
    tatsu: the symbols of each rule (`textgen._parse_and_convert`) and each rule's condition
    (`Rule.parse_conjunctive_query`). That was most of a step's time. Both are pure functions of their
    arguments. The ALFWorld family turns it on in each worker; `benchmarks/envs.py` compares both.
    """
    textgen._parse_and_convert = _cached_symbols if enabled else _PLAIN_SYMBOLS
    Rule.parse_conjunctive_query = staticmethod(_cached_query) if enabled else _PLAIN_QUERY


_LOGIC_CACHE = LRU(128)
_SAS_CACHE = LRU(128)


def clear_caches() -> None:
    """Forget every cached game, grammar, translation, plan and parse of this process (cold timings)."""
    for cache in (JSON_CACHE, _LOGIC_CACHE, _SAS_CACHE, PLAN_CACHE, _SYMBOLS_CACHE, _QUERY_CACHE):
        cache.clear()


_TASK_RULE = re.compile(r'"task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*"((?:[^"\\]|\\.)*)"\s*\}\s*\]')
_TASK_PLACEHOLDER = "TASK"


def _logic_for(domain: str, grammar: str) -> pddl_logic.GameLogic:
    """The game logic of (domain, grammar), cached.

    Games share one grammar but for their "task" rule (the goal sentence), and parsing the grammar is
    half the cost of loading a game. So the grammar is parsed once with a placeholder sentence, and each
    game gets a copy whose "task" rule alone is parsed from its own sentence. Grammars without exactly
    one such rule are parsed whole.
    """

    def make() -> pddl_logic.GameLogic:
        found = list(_TASK_RULE.finditer(grammar))
        if len(found) != 1:
            return pddl_logic.GameLogic(domain=domain, grammar=grammar)
        start, end = found[0].span(1)
        shared = grammar[:start] + _TASK_PLACEHOLDER + grammar[end:]
        base = _LOGIC_CACHE.get_or_make((domain, shared), lambda: pddl_logic.GameLogic(domain, shared))
        rhs = json.loads(f'"{found[0].group(1)}"')
        task_rules = ContextSensitiveGrammar.parse(json.dumps({"task": [{"rhs": rhs}]}))._rules["task"]
        logic = copy.copy(base)  # rules and actions are shared, never mutated (derivation copies them)
        logic.types = textworld.logic.TypeHierarchy()  # filled per game as its states are made
        logic.grammar = ContextSensitiveGrammar()
        logic.grammar._rules = defaultdict(list, base.grammar._rules)
        logic.grammar._rules["task"] = task_rules
        return logic

    return _LOGIC_CACHE.get_or_make((domain, grammar), make)


@dataclass
class _Translation:
    """Everything a fresh PddlState derives from (domain, problem) alone."""

    task: Any
    sas: bytes
    sas_replan: bytes
    actions: dict
    name2type: dict
    init_facts: list
    types: list


def _translation_for(domain: str, problem: str) -> _Translation:
    def make():
        task, sas = fast_downward.pddl2sas(domain, problem)
        _, sas_replan = fast_downward.pddl2sas(domain, problem, optimize=True)
        name2type = {o.name: o.type_name for o in task.objects}
        facts = []
        for atom in task.init:
            fact = _init_atom_to_fact(atom, name2type)
            if fact is not None:
                facts.append(fact)
        return _Translation(
            task=task,
            sas=sas.encode("utf-8"),
            sas_replan=sas_replan.encode("utf-8"),
            actions={a.name: a for a in task.actions},
            name2type=name2type,
            init_facts=facts,
            types=[(t.name, t.supertype_names) for t in task.types],
        )

    return _SAS_CACHE.get_or_make((domain, problem), make)


def _init_atom_to_fact(atom, name2type: dict) -> Proposition | None:
    """An initial-state atom as a TextWorld fact; equality, costs and distances carry no game state."""
    translate = fast_downward.translate
    if isinstance(atom, translate.pddl.conditions.Atom):
        if atom.predicate == "=":
            return None
        return Proposition(atom.predicate, [Variable(a, name2type[a]) for a in atom.args])
    if isinstance(atom, translate.pddl.f_expression.Assign):
        if atom.fluent.symbol == "total-cost":
            return None
        name = f"{atom.expression.value}"
        if name.isdigit():
            return None
        return Proposition(name, [Variable(a, name2type[a]) for a in atom.fluent.args])
    return None


class _CachedPddlState(pddl_logic.PddlState):
    """A PddlState built from a cached translation (same fields as the parent's constructor sets)."""

    def __init__(self, downward_lib, pddl_problem: str, logic: pddl_logic.GameLogic, tr: _Translation):
        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self._logic = logic
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        self.task, self.sas, self.sas_replan = tr.task, tr.sas, tr.sas_replan
        self._actions = tr.actions
        for name, supertypes in tr.types:
            try:
                logic.types.add(Type(name, supertypes))
            except ValueError:  # already known to this (shared) logic
                pass
        downward_lib.load_sas(tr.sas)
        downward_lib.load_sas_replan(tr.sas_replan)
        self.name2type = tr.name2type
        self.add_facts(tr.init_facts)
        atoms = (pddl_logic.Atom * downward_lib.get_state_size())()
        downward_lib.get_state(atoms)
        self.add_facts([f for f in (a.get_fact(self.name2type) for a in atoms) if not f.is_negation])


class CachedPddlEnv(PddlEnv):
    """`PddlEnv` whose load and reset reuse the per-process caches; the stepping logic is untouched."""

    def load(self, filename_or_data) -> None:
        if isinstance(filename_or_data, (str, os.PathLike)):
            self._game_file = str(filename_or_data)
            data = read_json(self._game_file)
        else:
            self._game_file, data = None, filename_or_data
        self._game_data = data
        self.walkthrough = data.get("walkthrough")
        self._logic = _logic_for(data["pddl_domain"], data["grammar"])
        self._pddl_state = self._fresh_state()
        self._entity_infos = self._get_entity_infos()

    def _fresh_state(self) -> _CachedPddlState:
        tr = _translation_for(self._game_data["pddl_domain"], self._game_data["pddl_problem"])
        return _CachedPddlState(self.downward_lib, self._game_data["pddl_problem"], self._logic, tr)

    def reset(self) -> GameState:
        self._pddl_state = self._fresh_state()
        self.prev_state = None
        self.state = GameState()
        self._last_action = None
        self._moves = 0
        context = {
            "state": self._pddl_state,
            "facts": list(self._pddl_state.facts),
            "variables": {},
            "mapping": {},
            "entity_infos": self._entity_infos,
        }
        self.state.feedback = self._logic.grammar.derive("#intro#", context)
        self.state.raw = self.state.feedback
        self._gather_infos()
        return self.state


class AlfWorldEnv:
    """One ALFWorld episode at a time, on the environment contract: reset(task) and step(action) return
    an `Observation` whose anchor is the raw observation text.

    Reward is WIN_REWARD on the winning step and 0 otherwise; an episode ends on a win or after
    `max_steps` steps. `reset(task, expert=True)` puts alfworld's expert plan for the current state in
    every observation of that episode: 'planner' (Fast Downward on the game's PDDL; works for every data
    version) or 'handcoded' (alfworld's rule-based expert; it emits the packaged grammar's verbs, so only
    games built on that grammar, such as the generated ones, suit it).
    """

    def __init__(self, max_steps: int = 50, expert_type: str = "planner"):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if expert_type not in EXPERT_TYPES:
            raise ValueError(f"expert_type must be one of {EXPERT_TYPES}, got {expert_type!r}")
        self.max_steps = max_steps
        self.expert_type = expert_type
        self._stacks: dict[bool, Any] = {}  # with / without alfworld's expert wrapper, built on first use
        self._loaded: dict[bool, str] = {}
        self._planner = PlannerExpert()
        self._env = None
        self._expert = False
        self._game = ""
        self._steps = 0
        self._done = True
        self._last: Observation | None = None
        self._task_type = ""
        self._goal = ""

    def _make(self, expert: bool):
        infos = textworld.EnvInfos(
            won=True,
            admissible_commands=True,
            extras=["gamefile"],
            facts=expert and self.expert_type == "handcoded",
        )
        env = AlfredInfos(AlfredDemangler(CachedPddlEnv(infos)))
        if expert:
            env = AlfredExpert(env, expert_type=self.expert_type)
        return env

    def _wrapped(self, expert: bool) -> bool:
        """Only the handcoded expert needs alfworld's AlfredExpert wrapper; the planner reads the engine."""
        return expert and self.expert_type == "handcoded"

    def reset(self, task: Task | str | os.PathLike, expert: bool = False) -> Observation:
        """Start a game (a Task whose payload is its game file, or the file itself) from its initial
        state; `expert=True` adds the expert plan to every observation of this episode."""
        game_file = str(task.payload if isinstance(task, Task) else task)
        if not os.path.isfile(game_file):
            raise FileNotFoundError(f"game file not found: {game_file}")
        expert = bool(expert)
        key = self._wrapped(expert)
        if key not in self._stacks:
            self._stacks[key] = self._make(key)
        env = self._stacks[key]
        if self._loaded.get(key) != game_file:
            self._loaded.pop(key, None)
            env.load(game_file)
            self._loaded[key] = game_file
        self._env, self._expert, self._game = env, expert, game_file
        self._task_type = task_type_of(game_file)
        state = env.reset()
        if expert and not key:
            st = os.stat(game_file)
            self._planner.start(env, (game_file, st.st_mtime_ns, st.st_size))
        self._goal = goal_from_observation(state.feedback)
        self._steps, self._done = 0, False
        self._last = self._observe(state, 0.0, False)
        return self._last

    def step(self, action: str) -> Observation:
        if self._env is None or self._last is None:
            raise RuntimeError("step() before reset()")
        if self._done:  # stepping a finished episode changes nothing
            return dataclasses.replace(self._last, reward=0.0)
        state, _, _ = self._env.step(str(action))
        self._steps += 1
        won = bool(state["won"])
        if self._expert and not self._wrapped(True):
            self._planner.advance(self._env, str(action), won)
        self._done = won or self._steps >= self.max_steps
        self._last = self._observe(state, WIN_REWARD if won else 0.0, self._done)
        return self._last

    def entities(self) -> set[str]:
        """Every object and receptacle of the loaded game ('apple 1'), read from the game itself, seen or
        not: the ground truth against which a claim that an episode named something absent is checked."""
        if self._env is None:
            raise RuntimeError("entities() before reset()")
        demangler = self._env._wrapped_env  # AlfredInfos wraps the demangler that names the entities
        names = (info.name for info in demangler._entity_infos.values() if info.name)
        return {n for n in names if re.fullmatch(r"[a-z]+ \d+", n) and not n.startswith(("loc ", "agent"))}

    def state_identity(self) -> str:
        """The PDDL state's facts, sorted: where the agent is, what it holds, what is open, hot, clean or
        where, so an action that changes nothing keeps it and the same room text with another inventory
        differs. Left out: the negated facts the planner library reports, and `checked` (set by `look`
        and `examine`, which move nothing)."""
        engine = self._env
        while not isinstance(engine, PddlEnv):
            engine = engine._wrapped_env
        facts = (str(f) for f in engine._pddl_state.facts if not f.is_negation)
        return "\n".join(sorted(f for f in facts if not f.startswith(("not_", "checked("))))

    def _observe(self, state, reward: float, done: bool) -> Observation:
        obs = state.feedback
        plan = None
        if self._expert:
            plan = list((state.get("extra.expert_plan") if self._wrapped(True) else self._planner.plan) or [])
        return Observation(
            text=obs,
            anchor=obs,
            state=self.state_identity(),
            admissible=list(state["admissible_commands"]),
            reward=reward,
            done=done,
            won=bool(state["won"]),
            expert_plan=plan,
            info={
                "step": self._steps,
                "game_file": self._game,
                "task_type": self._task_type,
                "goal": self._goal,
            },
        )
