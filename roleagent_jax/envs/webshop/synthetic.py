"""WebShop's synthetic goals (`human_goals=False`), the goals the reference RL runs train and test on.

Every product with an instruction in `items_ins_v2_1000.json` gets one goal per combination of its option
values (option names in sorted order, values in the product's order), its instruction followed by
" with name: value, and ..." and the price clause. The price cap is drawn once per product, as WebShop
does, from `rng` (WebShop: the unseeded global generator). Each goal carries WebShop's sampling
`weight` (the mean over its attributes of 1 / how many goals name that attribute). The caller shuffles.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

from roleagent_jax.envs.webshop.prices import price_clause


def synthetic_goals(products: list[dict], prices: dict[str, float], rng: random.Random) -> list[dict]:
    """One goal per option combination of every product that has an `instruction_text`, in product order."""
    goals = []
    for product in products:
        if product.get("instruction_text") is None:
            continue
        price_upper, price_text = price_clause(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for values in itertools.product(*(product["options"][n] for n in names)):
            chosen = dict(zip(names, values))
            option_text = ", and ".join(f"{k}: {v}" for k, v in chosen.items())
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["name"],
                    "product_category": product["product_category"],
                    "instruction_text": product["instruction_text"].strip(".")
                    + (f" with {option_text}" if option_text else "")
                    + price_text,
                    "attributes": product["instruction_attributes"],
                    "price_upper": price_upper,
                    "goal_options": chosen,
                }
            )
    named = Counter(a for g in goals for a in g["attributes"])
    for g in goals:
        g["weight"] = sum(1.0 / named[a] for a in g["attributes"]) / len(g["attributes"])
    return goals
