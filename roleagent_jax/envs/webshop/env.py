"""The WebShop env adapter of the environment contract: a `ShopSession` behind `reset(task)` / `step`.

A task's payload is a `GoalRef` (shop folder, price seed, goal kind, search index, goal index); each
worker process loads a shop once (catalogue and search index) and keeps it for every episode played on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from roleagent_jax.envs.base import Observation, Task
from roleagent_jax.envs.webshop.catalog import PRODUCTS_FILE, Catalogue
from roleagent_jax.envs.webshop.engine import MAX_STEPS, PAGE_SIZE, Shop, ShopSession, expert_action


@dataclass(frozen=True)
class GoalRef:
    """Where a goal lives: the shop folder, the seed of its prices and price caps, the goal's index, how
    many results a page shows, which goals the shop holds (`catalog.GOAL_KINDS`: goal i differs between
    them) and its search index (`search.INDEXES`)."""

    folder: str
    seed: int
    index: int
    page_size: int = PAGE_SIZE
    goals: str = "human"
    search_index: str = "lucene"


_SHOPS: dict[tuple, Shop] = {}


def load_shop(folder: str, seed: int, goals: str = "human", search_index: str = "lucene") -> Shop:
    """The shop in `folder` with prices drawn from `seed`, its `goals` and its `search_index`, loaded once
    per process (reloaded when its product file changes)."""
    st = os.stat(os.path.join(folder, PRODUCTS_FILE))
    key = (os.path.abspath(folder), seed, goals, search_index, st.st_mtime_ns, st.st_size)
    if key not in _SHOPS:
        _SHOPS[key] = Shop(Catalogue.from_dir(folder, seed=seed, goals=goals), search_index)
    return _SHOPS[key]


class WebShopEnv:
    """One shopping episode at a time (the contract's `Env`)."""

    def __init__(self, max_steps: int = MAX_STEPS):
        self.max_steps = max_steps
        self.session: ShopSession | None = None
        self.expert = False

    def reset(self, task: Task, expert: bool = False) -> Observation:
        ref = task.payload
        if not isinstance(ref, GoalRef):
            raise ValueError(f"task {task.id!r} has no WebShop goal reference as payload")
        shop = load_shop(ref.folder, ref.seed, ref.goals, ref.search_index)
        if self.session is None or self.session.shop is not shop or self.session.page_size != ref.page_size:
            self.session = ShopSession(shop, self.max_steps, ref.page_size)
        self.expert = bool(expert)
        text, info = self.session.reset(ref.index)
        return self._observation(text, 0.0, info)

    def step(self, action: str) -> Observation:
        if self.session is None:
            raise RuntimeError("step() before reset()")
        text, reward, _, info = self.session.step(action)
        return self._observation(text, reward, info)

    def _observation(self, text: str, reward: float, info: dict) -> Observation:
        s = self.session
        return Observation(
            text=text,
            anchor=info["anchor"],
            state=info["state"],
            admissible=info["admissible_commands"],
            reward=reward,
            done=s.done,
            won=info["won"],
            score=info["score"],
            expert_plan=[expert_action(s)] if self.expert and not s.done else ([] if self.expert else None),
            info={k: info[k] for k in ("page", "step", "bought", "chosen_options")},
        )
