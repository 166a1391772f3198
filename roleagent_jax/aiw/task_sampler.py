"""Failure-driven task sampling: one bounded, decaying logit per task of the pool.

Per round, ``update`` first decays every logit toward 0 (``logits *= decay``) and then adds the
round's boosts ``eta * similarity`` before clipping to ``[-bound, bound]``. Decaying first means a
fresh failure acts at full strength on the very next sampling, while old ones fade geometrically;
with no new failures the logits go to 0 and the distribution back to uniform.

    p = (1 - epsilon) * softmax(logits / temperature) + epsilon / N,   then the optional cap.

The uniform floor keeps every task at least ``epsilon / N`` (no starvation); the bound and the cap keep
any task from taking over (the public code's weights only grow).

Learnability: ``record`` keeps each task's recent success rate s (an exponential average over rounds).
A boost is worth most where a group of rollouts will disagree: ``learnability`` weighs it by
``floor + (1 - floor) * 4 s (1 - s)``, 1 at s = 1/2 and ``floor`` for tasks every rollout fails (or
wins), whose groups carry no advantage signal. Tasks never played weigh 1 (nothing says they are
hopeless). With ``floor = 1`` every weight is 1.

Selection toward the edge of the policy's ability (``selection="learnability"``): ``record`` also keeps
discounted counts of wins and plays per task. A task's success p is their Beta-smoothed rate, shrunk
toward its task type's rate (itself smoothed toward 1/2) by ``PRIOR_PLAYS`` pseudo-plays, so a task
never drawn borrows what its type's tasks showed (a large pool is rarely drawn twice) and a type never
played counts as p = 1/2: the most learnable, an optimist's guess. The failure softmax is multiplied by
``(4 p (1 - p)) ** strength`` before the uniform floor and the cap, so a task every rollout wins (or
fails), whose groups teach nothing, is drawn rarely, yet never never.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from roleagent_jax.types import Trajectory

SELECTIONS = ("aiw", "learnability")  # the aiw.selection key
PRIOR_PLAYS = 2.0  # pseudo-plays of a task's type rate in its own (the Beta prior's weight)


def apply_cap(p: np.ndarray, cap: float) -> np.ndarray:
    """Water-filling: clip entries to ``cap`` and hand the excess to the rest in proportion to their mass.

    Iterates until no entry exceeds ``cap``; needs ``cap * len(p) >= 1``. Entries below the cap only
    grow, so a floor such as epsilon/N is preserved.
    """
    p = np.asarray(p, np.float64).copy()
    n = p.size
    if cap * n < 1.0 - 1e-12:
        raise ValueError(f"cap {cap} is infeasible for {n} tasks: need cap >= 1/N = {1.0 / n:.6g}")
    fixed = np.zeros(n, bool)
    for _ in range(n + 1):
        over = (p > cap) & ~fixed
        if not over.any():
            break
        fixed |= over
        p[fixed] = cap
        rest = ~fixed
        free_mass = 1.0 - cap * fixed.sum()
        if not rest.any():
            break
        s = p[rest].sum()
        p[rest] = p[rest] * (free_mass / s) if s > 0 else free_mass / rest.sum()
    return p / p.sum()


class TaskSampler:
    """Seeded sampler of task ids whose probabilities follow recent failures (see module docstring)."""

    def __init__(
        self,
        n_tasks: int,
        eta: float = 1.0,
        decay: float = 0.9,
        temperature: float = 1.0,
        epsilon: float = 0.1,
        cap: float | None = None,
        seed: int = 0,
        bound: float = 5.0,
        selection: str = "aiw",
        selection_strength: float = 1.0,
        task_types: Sequence[str] | None = None,
    ):
        if n_tasks < 1:
            raise ValueError(f"the task pool is empty (n_tasks={n_tasks})")
        if bound <= 0:
            raise ValueError(f"bound must be > 0, got {bound}")
        if task_types is not None and len(task_types) != n_tasks:
            raise ValueError(f"{len(task_types)} task types for a pool of {n_tasks} tasks")
        self.n_tasks, self.bound = int(n_tasks), float(bound)
        self._set(eta=eta, decay=decay, temperature=temperature, epsilon=epsilon, cap=cap,
                  selection=selection, selection_strength=selection_strength)  # fmt: skip
        # Each task's type as a dense id (one type for all when none are given): the rate a task never
        # drawn borrows.
        names = list(task_types) if task_types is not None else [""] * self.n_tasks
        self.type_ids = np.unique(np.asarray(names, dtype=object).astype(str), return_inverse=True)[1]
        self.logits = np.zeros(self.n_tasks, np.float64)
        self.success = np.full(self.n_tasks, np.nan)  # recent success rate per task; NaN: never played
        self.wins = np.zeros(self.n_tasks, np.float64)  # discounted wins and plays per task (selection)
        self.plays = np.zeros(self.n_tasks, np.float64)
        self.rng = np.random.default_rng(seed)

    @classmethod
    def from_config(
        cls, n_tasks: int, config: Mapping, seed: int = 0, task_types: Sequence[str] | None = None
    ) -> TaskSampler:
        """A sampler with the settings of an ``aiw`` config section (eta, decay, temperature, epsilon, cap;
        cap 0 = none, never below 1 / n_tasks; selection, selection_strength); ``task_types`` per task
        (the pool's) let a task never drawn borrow its type's success rate."""
        sampler = cls(n_tasks, seed=seed, task_types=task_types)
        sampler.configure(config)
        return sampler

    def configure(self, config: Mapping) -> list[str]:
        """Take the settings of an ``aiw`` config section, keeping the logits, the success counts and the
        random state (a resumed run may change them on the command line); returns each change as
        ``"key old -> new"``."""
        cap = max(config["cap"], 1.0 / self.n_tasks) if config["cap"] else None
        keys = ("eta", "decay", "temperature", "epsilon", "selection", "selection_strength")
        new = {k: config[k] for k in keys} | {"cap": cap}
        changed = [f"{k} {getattr(self, k)} -> {v}" for k, v in new.items() if getattr(self, k) != v]
        self._set(**new)
        return changed

    def _set(
        self,
        *,
        eta: float,
        decay: float,
        temperature: float,
        epsilon: float,
        cap: float | None,
        selection: str,
        selection_strength: float,
    ) -> None:
        """Check and take the sampling settings (a bad value raises ValueError naming it)."""
        if selection not in SELECTIONS:
            raise ValueError(f"aiw.selection must be one of {SELECTIONS}, got {selection!r}")
        if selection_strength <= 0:
            raise ValueError(f"aiw.selection_strength must be > 0, got {selection_strength}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        n = self.n_tasks
        if cap is not None and not (1.0 / n - 1e-12 <= cap <= 1.0):
            raise ValueError(f"cap must be in [1/N, 1] = [{1.0 / n:.6g}, 1] for N={n}, got {cap}")
        self.eta, self.decay, self.temperature = float(eta), float(decay), float(temperature)
        self.epsilon, self.cap = float(epsilon), cap
        self.selection, self.selection_strength = selection, float(selection_strength)

    def type_shares(self, task_types: Sequence[str]) -> dict[str, float]:
        """The sampling probability of each task type, in the order the types first appear (tasks given
        by their types)."""
        share: dict[str, float] = {}
        for task_type, p in zip(task_types, self.probs(), strict=True):
            share[task_type] = share.get(task_type, 0.0) + float(p)
        return share

    def record(
        self, outcomes: Mapping[int, float], keep: float = 0.5, plays: Mapping[int, int] | None = None
    ) -> None:
        """Fold this round's success rate per task (won share of its rollouts) into the recent rate, and
        its wins and plays (``plays``: rollouts per task, 1 each when not given) into the counts, the
        earlier ones discounted by ``keep`` (the policy they measured has changed since)."""
        for task, won in outcomes.items():
            t, won = int(task), float(won)
            if not (0 <= t < self.n_tasks and 0.0 <= won <= 1.0):
                raise ValueError(f"outcome {won} for task {t}: need a task of the pool and a rate in [0, 1]")
            old = self.success[t]
            self.success[t] = won if np.isnan(old) else keep * old + (1.0 - keep) * won
            n = float(plays[task]) if plays is not None else 1.0
            self.wins[t] = keep * self.wins[t] + won * n
            self.plays[t] = keep * self.plays[t] + n

    def record_episodes(self, played: Sequence[Trajectory]) -> None:
        """``record`` the won share and count of each task's episodes; episodes the environment broke
        are no outcome of the policy and are left out."""
        wins: dict[int, list[float]] = {}
        for t in played:
            if not t.env_failed:
                wins.setdefault(t.task_id, []).append(float(t.won))
        self.record({k: sum(w) / len(w) for k, w in wins.items()}, plays={k: len(w) for k, w in wins.items()})

    def success_estimate(self) -> np.ndarray:
        """Each task's success p from its counts, shrunk toward its type's rate by ``PRIOR_PLAYS``
        pseudo-plays; a type's rate is its tasks' pooled counts under a Beta(1, 1) prior (1/2 unplayed)."""
        type_wins = np.bincount(self.type_ids, weights=self.wins)
        type_plays = np.bincount(self.type_ids, weights=self.plays)
        type_rate = (type_wins + 1.0) / (type_plays + 2.0)
        prior = type_rate[self.type_ids]
        return (self.wins + PRIOR_PLAYS * prior) / (self.plays + PRIOR_PLAYS)

    def selection_weights(self) -> np.ndarray:
        """Per task, ``(4 p (1 - p)) ** strength`` under learnability selection (1 at p = 1/2), else 1."""
        if self.selection != "learnability":
            return np.ones(self.n_tasks)
        p = self.success_estimate()
        return (4.0 * p * (1.0 - p)) ** self.selection_strength

    def learnability(self, task: int, floor: float, default: float = 1.0) -> float:
        """How much a boost of `task` is worth (module docstring); `default` for a task never played."""
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"aiw.unlearnable_weight must be in [0, 1], got {floor}")
        s = self.success[int(task)]
        return default if np.isnan(s) else floor + (1.0 - floor) * 4.0 * s * (1.0 - s)

    def update(self, boosts: Mapping[int, float]) -> None:
        """One round: decay all logits, add ``eta * similarity`` to the boosted tasks, clip."""
        self.logits *= self.decay
        for task, sim in boosts.items():
            t = int(task)
            if not 0 <= t < self.n_tasks:
                raise ValueError(f"boost for task {t} outside the pool of {self.n_tasks} tasks")
            if not np.isfinite(sim):
                raise ValueError(f"boost for task {t} is not finite: {sim}")
            self.logits[t] += self.eta * float(sim)
        np.clip(self.logits, -self.bound, self.bound, out=self.logits)

    def probs(self) -> np.ndarray:
        z = self.logits / self.temperature
        e = np.exp(z - z.max()) * self.selection_weights()
        p = (1.0 - self.epsilon) * e / e.sum() + self.epsilon / self.n_tasks
        if self.cap is not None:
            p = apply_cap(p, self.cap)
        return p / p.sum()

    def sample(self, k: int, rng: np.random.Generator | None = None, replace: bool = False) -> np.ndarray:
        """k task ids (distinct unless ``replace``), from the internal generator unless one is given."""
        if k < 0 or (not replace and k > self.n_tasks):
            raise ValueError(
                f"cannot draw {k} distinct tasks from a pool of {self.n_tasks}; lower k or replace=True"
            )
        gen = self.rng if rng is None else rng
        return gen.choice(self.n_tasks, size=k, replace=replace, p=self.probs()).astype(np.int64)

    def entropy(self) -> float:
        p = self.probs()
        return float(-(p * np.log(np.where(p > 0, p, 1.0))).sum())

    def state_dict(self) -> dict:
        """JSON-friendly state: settings, logits and the exact generator state."""
        return {
            "n_tasks": self.n_tasks,
            "eta": self.eta,
            "decay": self.decay,
            "temperature": self.temperature,
            "epsilon": self.epsilon,
            "cap": self.cap,
            "bound": self.bound,
            "logits": self.logits.tolist(),
            "success": [None if np.isnan(x) else float(x) for x in self.success],
            "selection": self.selection,
            "selection_strength": self.selection_strength,
            "wins": self.wins.tolist(),
            "plays": self.plays.tolist(),
            "rng": copy.deepcopy(self.rng.bit_generator.state),
        }

    def load_state_dict(self, state: Mapping) -> None:
        if int(state["n_tasks"]) != self.n_tasks:
            raise ValueError(
                f"sampler checkpoint is for {state['n_tasks']} tasks but the pool has {self.n_tasks}; "
                "resume with the same task pool"
            )
        for key in ("eta", "decay", "temperature", "epsilon", "bound"):
            setattr(self, key, float(state[key]))
        self.cap = state["cap"]
        self.logits = np.asarray(state["logits"], np.float64).copy()
        success = state.get("success") or [None] * self.n_tasks  # older checkpoints have no rates
        self.success = np.array([np.nan if x is None else float(x) for x in success], np.float64)
        # Checkpoints from before learnability selection have no counts: the sampler starts them afresh.
        self.selection = state.get("selection", "aiw")
        self.selection_strength = float(state.get("selection_strength", self.selection_strength))
        for key in ("wins", "plays"):
            setattr(self, key, np.asarray(state.get(key) or np.zeros(self.n_tasks), np.float64).copy())
        rng_state = copy.deepcopy(dict(state["rng"]))
        self.rng = np.random.Generator(getattr(np.random, rng_state["bit_generator"])())
        self.rng.bit_generator.state = rng_state
