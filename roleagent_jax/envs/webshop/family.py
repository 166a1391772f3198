"""WebShop as a scenario family of the environment contract, registered as "webshop".

Splits. Real data (WebShop's files in `data_dir` or $WEBSHOP_DATA), by the option `protocol`:
"paper" (the default; verl-agent's and Role-Agent's runs, `human_goals=False`): WebShop's synthetic
goals (one per option combination of each product), "train" goals 500 onwards, "test" a fixed draw of
256 of the first 500 (the reference evaluates 2 x 128 episodes drawn from them); "webshop" (WebShop's
own protocol): the human instructions, "test" the first 500 goals, "train" the rest. The protocol
concerns real data only. Generated (no download): "gen_test", "gen_valid" and
"gen_train" are disjoint goals on the seen product families of one generated shop (the first and the
second quarter, and the second half of them, in WebShop's shuffled goal order: with the shop option
`goals_per_product` > 1 a product's goals fall on every side). "gen_valid" is a validation slice of the
held-out goals, drawn like "gen_test": recipes are chosen on it, so the reported "gen_test" panel
chooses nothing. "gen_unseen" holds the goals on families that are never trained on; `n` takes the
first n goals of the split, `seed` picks the shop (the option `shop_seed` fixes one for every seed: a
trainer draws each purpose's tasks with its own seed, so without it training and evaluation get
different shops).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from roleagent_jax.envs.base import Admissible, Family, History, PoolRequest, Task, TaskPool
from roleagent_jax.envs.text import VALIDITY_RULES, matching_command, reference_action
from roleagent_jax.envs.webshop import generate as gen
from roleagent_jax.envs.webshop import heuristic, prompts
from roleagent_jax.envs.webshop.catalog import Catalogue, data_dir_of
from roleagent_jax.envs.webshop.engine import MAX_STEPS, PAGE_SIZE, ShopSession, expert_action, split_action
from roleagent_jax.envs.webshop.env import GoalRef, WebShopEnv, load_shop
from roleagent_jax.envs.webshop.reference_prompt import build_reference_prompt
from roleagent_jax.envs.webshop.search import INDEXES
from roleagent_jax.envs.webshop.taxonomy import FAILURE_KEYWORDS, FAILURE_TYPES

REAL_SPLITS = ("test", "train")
GEN_SPLITS = ("gen_test", "gen_valid", "gen_train", "gen_unseen")
PROTOCOLS = {"paper": "synthetic", "webshop": "human"}  # protocol -> the goals its real splits play
PROMPTS = ("reference", "compact")  # the reference runs' WEBSHOP_TEMPLATE | a short one for tiny models
PAPER_TEST_GOALS = 256  # the reference evaluates 2 x 128 episodes on goals drawn from the first 500
# The draw is fixed (seed: the reference's validation seed offset), so every run's panel agrees.
PAPER_TEST_SEED = 1000
_PRICE = re.compile(r"price lower than [\d.]+ dollars")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def default_gen_dir() -> Path:
    """Where generated shops go ($ROLEAGENT_GEN_DIR/webshop or ~/.cache/roleagent_jax/games/webshop)."""
    env = os.environ.get("ROLEAGENT_GEN_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "roleagent_jax" / "games") / "webshop"


def _goal_ids(catalogue: Catalogue, family_of: Mapping[str, str], split: str) -> list[int]:
    unseen = {f.key for f in gen.FAMILIES if f.unseen}
    seen_ids = [i for i, g in enumerate(catalogue.goals) if family_of[g["asin"]] not in unseen]
    if split == "gen_unseen":
        return [i for i, g in enumerate(catalogue.goals) if family_of[g["asin"]] in unseen]
    half = len(seen_ids) // 2
    held_out, quarter = seen_ids[:half], half // 2
    parts = {"gen_test": held_out[:quarter], "gen_valid": held_out[quarter:], "gen_train": seen_ids[half:]}
    return parts[split]


def _expert_plan(session: ShopSession, index: int) -> tuple[str, ...] | None:
    """The expert's actions on goal `index`, when they win."""
    session.reset(index)
    plan = []
    while not session.done:
        action = expert_action(session)
        plan.append(action)
        session.step(action)
    return tuple(plan) if session.state.score == 1.0 else None


class WebShop(Family):
    name = "webshop"
    task_types = gen.CATEGORIES
    action_stop = prompts.ACTION_STOP
    empty_action = "click[back to search]"
    has_expert = True
    data_splits = REAL_SPLITS
    generated_splits = GEN_SPLITS
    # page_size: results per page (WebShop: 10); goals_per_product: instructions per generated product;
    # shop_seed: the generated shop of every split (-1: the split's own seed, so each seed is a new shop);
    # protocol: the real splits' goals (PROTOCOLS); search_index: search.INDEXES; prompt: PROMPTS;
    # valid: the reference's format rule or "the action is available"; history_chars: earlier pages in
    # the prompt cut to this many characters (0: whole, as the reference shows them)
    gen_options = {
        "n_products": 1000,
        "page_size": PAGE_SIZE,
        "goals_per_product": 1,
        "shop_seed": -1,
        "protocol": "paper",
        "search_index": "lucene",
        "prompt": "reference",
        "valid": "format",
        "history_chars": 0,
    }
    predictor_framing = prompts.PREDICTOR_FRAMING
    analysis_intro = (
        "You review a failed attempt at buying a product in a web shop and explain why it failed."
    )
    failure_types = FAILURE_TYPES
    failure_keywords = FAILURE_KEYWORDS
    pattern_keywords = {f: (f,) for f in gen.CATEGORIES}

    def make_env(self, max_steps: int) -> WebShopEnv:
        return WebShopEnv(max_steps)

    def generated_tasks(self, request: PoolRequest) -> TaskPool:
        """The first n goals (0: all) of the split in the generated shop of `shop_seed` (or the seed)."""
        opts, split, n = request.options, request.split, request.n
        self.check_options(opts)
        page_size, index = int(opts["page_size"]), opts["search_index"]
        n_products, per_product = int(opts["n_products"]), int(opts["goals_per_product"])
        shop_seed = request.seed if int(opts["shop_seed"]) < 0 else int(opts["shop_seed"])
        name = f"shop_seed{shop_seed}_p{n_products}" + (f"_g{per_product}" if per_product != 1 else "")
        folder = Path(request.gen_dir or default_gen_dir()) / name
        made = gen.generate(folder, shop_seed, n_products, per_product)
        shop = load_shop(str(made.folder), shop_seed, "human", index)
        ids = _goal_ids(shop.catalogue, made.family_of, split)
        if n > len(ids):
            raise ValueError(
                f"split {split!r} of a {n_products}-product shop has {len(ids)} goals, {n} asked for; "
                "raise env option n_products"
            )
        ids = ids[: n or None]
        session = ShopSession(shop, MAX_STEPS, page_size)
        plans = {i: _expert_plan(session, i) for i in ids}
        ref = GoalRef(str(made.folder), shop_seed, -1, page_size, "human", index)
        return self._pool(shop.catalogue, ref, ids, plans)

    def data_tasks(self, request: PoolRequest) -> TaskPool:
        """WebShop's own goals of "test" or "train" under the option `protocol` (see the module)."""
        opts, split = request.options, request.split
        self.check_options(opts)
        if split not in REAL_SPLITS:
            return super().data_tasks(request)
        page_size, index = int(opts["page_size"]), opts["search_index"]
        goals = PROTOCOLS[opts["protocol"]]
        shop = load_shop(str(data_dir_of(request.data_dir)), request.seed, goals, index)
        ids = shop.catalogue.split(split)  # all of it: a real split is never cut (evaluate's --limit)
        if goals == "synthetic" and split == "test":
            ids = sorted(random.Random(PAPER_TEST_SEED).sample(ids, min(PAPER_TEST_GOALS, len(ids))))
        ref = GoalRef(shop.catalogue.source, request.seed, -1, page_size, goals, index)
        return self._pool(shop.catalogue, ref, ids, {})

    def check_options(self, options: Mapping[str, Any]) -> None:
        for key, allowed in (
            ("protocol", tuple(PROTOCOLS)),
            ("search_index", INDEXES),
            ("prompt", PROMPTS),
            ("valid", VALIDITY_RULES),
        ):
            if options[key] not in allowed:
                raise ValueError(f"{key}={options[key]!r}: must be one of {', '.join(allowed)}")
        for key, low in (("page_size", 1), ("history_chars", 0)):
            if not isinstance(options[key], int) or options[key] < low:
                raise ValueError(f"{key}={options[key]!r}: must be an integer >= {low}")

    @staticmethod
    def _pool(catalogue: Catalogue, ref: GoalRef, ids: list[int], plans: dict) -> TaskPool:
        """Goals `ids` of the shop `ref` names (its index field is set per goal)."""
        tasks = [
            Task(
                id=f"{i}:{catalogue.goals[i]['asin']}",
                type=catalogue.goals[i]["category"],
                goal=catalogue.goals[i]["instruction_text"],
                payload=dataclasses.replace(ref, index=i),
                expert_plan=plans.get(i),
            )
            for i in ids
        ]
        return TaskPool(tasks, ref.folder)

    def agent_prompt(
        self, goal: str, history: History, observation: str, admissible: Admissible, step: int, history_k: int
    ) -> str:
        chars = self.options["history_chars"]
        if self.options["prompt"] == "reference":
            return build_reference_prompt(goal, history, observation, admissible, step, history_k, chars)
        return prompts.build_agent_prompt(goal, history, observation, admissible, step, history_k, chars)

    def parse_action(self, response: str, admissible: Sequence[str] | None) -> tuple[str | None, bool]:
        if self.options["valid"] == "available":
            return prompts.parse_action(response, admissible)
        text, formed = reference_action(response)
        parsed = split_action(text) if text is not None else None
        if parsed is None:  # no search[...] or click[...]: the env changes nothing, the format decides
            return text, formed
        action = f"{parsed[0]}[{parsed[1]}]"
        return (matching_command(action, admissible or []) or action), formed

    def format_action(self, action: str) -> str:
        """Under the reference's format rule an answer needs its (here empty) reasoning block too."""
        answer = super().format_action(action)
        return answer if self.options["valid"] == "available" else f"<think></think>{answer}"

    def predictor_prompt(self, goal, history, observation, action, horizon) -> str:
        from roleagent_jax.envs.predictor_prompt import build_predictor_prompt

        return build_predictor_prompt(
            goal, history, observation, action, horizon, framing=self.predictor_framing, obs_chars=600
        )

    def analyse_failure(self, traj, max_steps: int):
        return heuristic.analyse(traj, max_steps)

    def abstract_goal(self, goal: str, task_type: str) -> str:
        """The instruction with its price limit and numbers replaced ("... price lower than N dollars")."""
        text = _PRICE.sub("price lower than N dollars", " ".join(goal.lower().split()))
        return _NUMBER.sub("N", text)

    def pattern_name(self, task_type: str) -> str:
        return heuristic.pattern_name(task_type)

    def pattern_text(self, task_type: str) -> str:
        return (
            f"{self.pattern_name(task_type)}: search the {task_type} product, open it, choose the options "
            "asked for, buy within the price limit"
        )
