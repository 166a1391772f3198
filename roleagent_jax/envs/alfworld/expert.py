"""ALFWorld's expert: alfworld's planner (Fast Downward on the game's own PDDL) without its cost per step.

The warm start and `evaluate --policy=expert` follow it; the generator checks every game with it.
"""

from __future__ import annotations

import re

import fast_downward
from textworld.envs.pddl import logic as pddl_logic

from roleagent_jax.envs.alfworld.games import LRU

PLAN_CACHE = LRU(1024)  # initial plans per game, per process
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
        self.plan = list(PLAN_CACHE.get_or_make(game_key, lambda: self._initial_plan(env)))
        return self.plan

    def advance(self, env, action: str, won: bool) -> list[str]:
        if won:
            self.plan = []
        elif self.plan and action.strip() == self.plan[0]:
            self.plan = self.plan[1:]
        else:
            self.plan = self._replan(env)
        return self.plan
