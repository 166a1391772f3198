"""ALFWorld on its real engine: TextWorld's PDDL environment under alfworld's own wrappers.

One `AlfWorldEnv` plays one game at a time and can be reset to any game file. The RL loop resets the
same few games thousands of times, so everything that depends only on a game file is computed once
per process and kept: the parsed JSON, the grammar (`GameLogic`) and Fast Downward's PDDL -> SAS
translation, which is most of the cost of a plain `PddlEnv.reset`. A reset then only reloads the SAS
task into the planner library and renders the intro text. Games differ in their grammar only by the
task sentence, so one parse serves them all; and textworld's rule-string parsers, which re-parsed the
same strings on every step, remember their results (steps about 3x faster).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fast_downward
import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
from textworld.core import GameState
from textworld.envs.pddl import PddlEnv, textgen
from textworld.envs.pddl import logic as pddl_logic
from textworld.envs.pddl.textgen import ContextSensitiveGrammar
from textworld.logic import Proposition, Rule, Type, Variable

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
    arguments. On at import; `benchmarks/envs.py` turns it off to time textworld's own.
    """
    textgen._parse_and_convert = _cached_symbols if enabled else _PLAIN_SYMBOLS
    Rule.parse_conjunctive_query = staticmethod(_cached_query) if enabled else _PLAIN_QUERY


memoize_textworld_parsers()


TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
WIN_REWARD = 10.0
GOAL_PREFIX = "Your task is to: "
GAME_FILE = "game.tw-pddl"
EXPERT_TYPES = ("planner", "handcoded")


def task_type_of(game_file: str | os.PathLike) -> str:
    """Task type from the folder layout `<task_type>-<Obj>-<Mrecep>-<Recep>-<scene>/<trial>/game.tw-pddl`."""
    name = Path(game_file).parent.parent.name.split("-", 1)[0]
    if name not in TASK_TYPES:
        raise ValueError(
            f"cannot tell the task type of {game_file}: folder prefix {name!r} is not one of {TASK_TYPES}"
        )
    return name


def goal_of(game_data: dict) -> str:
    """The task sentence as the intro will show it, read from the game's grammar without loading it."""
    grammar = game_data.get("grammar", "")
    start = grammar.find(GOAL_PREFIX)
    if start < 0:
        return ""
    start += len(GOAL_PREFIX)
    end = grammar.find('"', start)
    return grammar[start:end].strip()


def goal_from_observation(obs: str) -> str:
    """The task sentence from an intro observation ('' when the text has none)."""
    start = obs.find(GOAL_PREFIX)
    if start < 0:
        return ""
    return obs[start + len(GOAL_PREFIX) :].strip().splitlines()[0].strip()


def split_dir(data_dir: str | os.PathLike | None, split: str) -> Path:
    """Locate `<data>/json_2.1.1/<split>` (or `<data>/<split>`), with a message saying how to get the data."""
    root = data_dir or os.environ.get("ALFWORLD_DATA")
    hint = (
        "ALFWorld games are not bundled. Run `alfworld-download` (from the alfworld package), then set "
        "$ALFWORLD_DATA to the folder it filled (the one holding json_2.1.1/) or pass --data=DIR. "
        "The procedurally generated splits (gen_seen, gen_unseen) need no download."
    )
    if not root:
        raise FileNotFoundError(f"no ALFWorld data folder given for split {split!r}. {hint}")
    root = Path(os.path.expandvars(str(root))).expanduser()
    for cand in (root / "json_2.1.1" / split, root / split):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(
        f"split {split!r} not found under {root} (looked for json_2.1.1/{split} and {split}). {hint}"
    )


def list_games(folder: str | os.PathLike) -> list[str]:
    """Sorted playable game files under a folder, filtered the way alfworld's own loader filters them."""
    games = []
    for path in sorted(Path(folder).rglob(GAME_FILE)):
        text = str(path)
        if "movable" in text or "Sliced" in text:
            continue
        if not _read_json(text).get("solvable", False):
            continue
        games.append(text)
    return games


class _LRU(OrderedDict):
    """A small least-recently-used map: per-process caches must not grow with the 3,553 train games."""

    def __init__(self, maxsize: int):
        super().__init__()
        self.maxsize = maxsize

    def get_or_make(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        if len(self) > self.maxsize:
            self.popitem(last=False)
        return value


_JSON_CACHE = _LRU(256)
_LOGIC_CACHE = _LRU(128)
_SAS_CACHE = _LRU(128)
_PLAN_CACHE = _LRU(1024)


def clear_caches() -> None:
    """Forget every cached game, grammar, translation, plan and parse of this process (cold timings)."""
    for cache in (_JSON_CACHE, _LOGIC_CACHE, _SAS_CACHE, _PLAN_CACHE, _SYMBOLS_CACHE, _QUERY_CACHE):
        cache.clear()


def _read_json(path: str) -> dict:
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)

    def make():
        with open(path) as f:
            return json.load(f)

    return _JSON_CACHE.get_or_make(key, make)


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
            data = _read_json(self._game_file)
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


_PLANNER_LIB: list = []  # one Fast Downward library per process for initial plans on pruned problems
_TOKEN = re.compile(r"[^\s()]+")
_APPLIANCE_TYPES = {"sinkbasintype", "bathtubbasintype", "microwavetype", "fridgetype"}


def prune_problem(problem: str) -> str | None:
    """The problem without what the goal cannot need (None: nothing to prune): objects of types the goal
    never names, and receptacles that hold none of the remaining objects, are not of a type the goal
    names and are not appliances (sink, microwave, fridge).

    Without capacity constraints in the domain, these can neither help nor block a plan, yet they blow
    up the planner's search on big kitchens (minutes instead of a second). Any plan for the pruned
    problem is a valid plan for the full one, with the same entity names.
    """
    at = problem.rfind("(:goal")
    if at < 0:
        return None
    head, goal = problem[:at].lower(), problem[at:].lower()  # PDDL names are case-insensitive
    goal_types = set(re.findall(r"\(objecttype \?\S+ (\S+?)\)", goal))
    if not goal_types:
        return None
    typed = dict(re.findall(r"\(objecttype (\S+) (\S+?)\)", head))
    drop = {o for o, t in typed.items() if t not in goal_types}
    # Receptacles matter if the goal names their type, an action needs them, or they hold a kept object.
    keep_rtypes = set(re.findall(r"\(receptacletype \?\S+ (\S+?)\)", goal)) | _APPLIANCE_TYPES
    holders = {r for o, r in re.findall(r"\(inreceptacle (\S+) (\S+?)\)", head) if o not in drop}
    rtyped = dict(re.findall(r"\(receptacletype (\S+) (\S+?)\)", head))
    drop |= {r for r, t in rtyped.items() if t not in keep_rtypes and r not in holders}
    if not drop:
        return None
    kept = [line for line in problem[:at].splitlines() if not drop.intersection(_TOKEN.findall(line.lower()))]
    return "\n".join(kept) + "\n" + problem[at:]


class PlannerExpert:
    """alfworld's planner expert (Fast Downward on the game's own PDDL, as `AlfredExpert(expert_type=
    "planner")` computes it) without its cost on every step.

    The engine is deterministic, so a plan stays valid while the agent follows it: the planner runs at
    most once per game for the initial state (cached per process) and again only after the agent
    leaves the plan. Commands come from the game's grammar, so any data version's verbs work.
    """

    def __init__(self):
        self.plan: list[str] = []

    @staticmethod
    def _plan_for(env, problem: str) -> list[str]:
        """Plan on the pruned problem with this process's planner library; names as the game shows them."""
        base = env.unwrapped
        pruned = prune_problem(problem) or problem
        if not _PLANNER_LIB:
            _PLANNER_LIB.append(fast_downward.load_lib())
        state = pddl_logic.PddlState(_PLANNER_LIB[0], pruned, base._logic)
        return list(state.replan(base._entity_infos))

    @classmethod
    def _initial_plan(cls, env) -> list[str]:
        return cls._plan_for(env, env.unwrapped._game_data["pddl_problem"])

    @classmethod
    def _replan(cls, env) -> list[str]:
        """Plan from the current state: the game's problem with its initial facts replaced by today's."""
        base = env.unwrapped
        problem = base._game_data["pddl_problem"]
        init, goal = problem.find("(:init"), problem.rfind("(:goal")
        facts = [
            f"({f.name} {' '.join(v.name for v in f.arguments)})"
            for f in base._pddl_state.facts
            if not f.name.startswith("new-axiom")
        ]
        now = problem[:init] + "(:init\n" + "\n".join(facts) + "\n)\n\n" + problem[goal:]
        return cls._plan_for(env, now)

    def start(self, env, game_key) -> list[str]:
        self.plan = list(_PLAN_CACHE.get_or_make(game_key, lambda: self._initial_plan(env)))
        return self.plan

    def advance(self, env, action: str, won: bool) -> list[str]:
        if won:
            self.plan = []
        elif self.plan and action.strip() == self.plan[0]:
            self.plan = self.plan[1:]
        else:
            self.plan = self._replan(env)
        return self.plan


class AlfWorldEnv:
    """One ALFWorld episode at a time: reset(game_file) -> (obs, info); step(action) -> (obs, r, done, info).

    Reward is WIN_REWARD on the winning step and 0 otherwise; an episode ends on a win or after
    `max_steps` steps. With `expert_plan=True` the info carries alfworld's expert plan for the current
    state: 'planner' (Fast Downward on the game's PDDL; works for every data version) or 'handcoded'
    (alfworld's rule-based expert; it emits the packaged grammar's verbs, so only games built on that
    grammar, such as the generated ones, suit it).
    """

    def __init__(self, max_steps: int = 50, expert_plan: bool = False, expert_type: str = "planner"):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if expert_type not in EXPERT_TYPES:
            raise ValueError(f"expert_type must be one of {EXPERT_TYPES}, got {expert_type!r}")
        self.max_steps = max_steps
        self.expert_plan = expert_plan
        self.expert_type = expert_type
        self._stacks: dict[bool, Any] = {}  # with / without alfworld's expert wrapper, built on first use
        self._loaded: dict[bool, str] = {}
        self._planner = PlannerExpert()
        self._env = None
        self._expert = False
        self._game = ""
        self._steps = 0
        self._done = True
        self._last: tuple[str, dict] = ("", {})
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

    def reset(self, game_file: str, expert: bool | None = None) -> tuple[str, dict]:
        """Start `game_file` from its initial state; `expert` (default: the constructor's expert_plan)
        adds the expert plan to every info of this episode."""
        game_file = str(game_file)
        if not os.path.isfile(game_file):
            raise FileNotFoundError(f"game file not found: {game_file}")
        expert = self.expert_plan if expert is None else bool(expert)
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
        obs = state.feedback
        self._goal = goal_from_observation(obs)
        self._steps, self._done = 0, False
        info = self._info(state, obs)
        self._last = (obs, info)
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._env is None:
            raise RuntimeError("step() before reset()")
        if self._done:  # stepping a finished episode changes nothing
            obs, info = self._last
            return obs, 0.0, True, info
        state, _, _ = self._env.step(str(action))
        self._steps += 1
        if self._expert and not self._wrapped(True):
            self._planner.advance(self._env, str(action), bool(state["won"]))
        obs = state.feedback
        info = self._info(state, obs)
        self._done = info["won"] or self._steps >= self.max_steps
        self._last = (obs, info)
        return obs, (WIN_REWARD if info["won"] else 0.0), self._done, info

    def _info(self, state, obs: str) -> dict:
        info = {
            "won": bool(state["won"]),
            "admissible_commands": list(state["admissible_commands"]),
            "task_type": self._task_type,
            "goal": self._goal,
            "anchor": obs,
            "env_failed": False,
            "step": self._steps,
            "game_file": self._game,
        }
        if self._expert:
            plan = state.get("extra.expert_plan") if self._wrapped(True) else self._planner.plan
            info["expert_plan"] = list(plan or [])
        return info
