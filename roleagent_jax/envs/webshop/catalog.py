"""WebShop's catalogue files, read as WebShop reads them, and its goals (human or synthetic).

A shop folder holds WebShop's three files (the real ones come from WebShop's ``setup.sh``; the
generated shop writes the same format):

- ``items_shuffle_1000.json``: the products (list of scraped records: ``asin``, ``name``,
  ``full_description``, ``small_description``, ``pricing`` ("$12.99", or "$5.99$9.99" for a range),
  ``customization_options`` ({name: [{"value", "image"}]}), ``images``, ``category``, ``query``,
  ``product_category``);
- ``items_ins_v2_1000.json``: {asin: {"attributes": [...], ...}};
- ``items_human_ins.json``: {asin: [{"instruction", "instruction_attributes", "instruction_options"}]}.

Products get WebShop's derived fields (``Title``, ``Description``, ``BulletPoints``, ``Price``,
``pricing``, ``options``, ``Attributes``) and goals are built as its human-goal builder does (or its
synthetic one, `synthetic.py`), then shuffled with its fixed seed (233), so goal i is WebShop's goal i. WebShop draws each product's price
(uniform in a range) and each goal's price cap from the unseeded global generator, so no two of its
servers agree on them; here both come from a generator seeded by ``seed``.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from roleagent_jax.envs.webshop.prices import price_clause
from roleagent_jax.envs.webshop.synthetic import synthetic_goals

PRODUCTS_FILE = "items_shuffle_1000.json"
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
HUMAN_FILE = "items_human_ins.json"
FILES = (PRODUCTS_FILE, ATTRIBUTES_FILE, HUMAN_FILE)
DATA_ENV = "WEBSHOP_DATA"
GOAL_SHUFFLE_SEED = 233  # WebShop's own
GOAL_KINDS = ("human", "synthetic")
TEST_GOALS = 500  # the reference runs test on the first 500 goals and train on the rest
SETUP_HINT = (
    "WebShop's catalogue is not bundled: run WebShop's setup.sh (github.com/princeton-nlp/WebShop, "
    "`./setup.sh -d small`), then set $WEBSHOP_DATA (or --config.env.data_dir) to its data/ folder. "
    "The generated shop (gen_* splits) needs no download."
)


def data_dir_of(data_dir: str | os.PathLike | None) -> Path:
    """The shop folder (`data_dir`, else $WEBSHOP_DATA), checked to hold all three files."""
    root = data_dir or os.environ.get(DATA_ENV)
    if not root:
        raise FileNotFoundError(f"no WebShop data folder given (data_dir or ${DATA_ENV}). {SETUP_HINT}")
    root = Path(os.path.expandvars(str(root))).expanduser()
    for name in FILES:
        if not (root / name).is_file():
            raise FileNotFoundError(f"WebShop file {name} not found in {root}. {SETUP_HINT}")
    return root


def _read(path: Path):
    with open(path) as f:
        return json.load(f)


def _pricing(text) -> tuple[list[float], str]:
    if not text:
        return [100.0], "$100.0"
    prices = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in str(text).split("$")[1:]]
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def _options(custom) -> dict[str, list[str]]:
    options = {}
    for name, contents in (custom or {}).items():
        if contents is None:
            continue
        options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    return options


def prepare_products(raw: list[dict], attributes: dict, human: dict) -> list[dict]:
    """WebShop's product records with its derived fields; bad or repeated asins are skipped as it does."""
    seen: set[str] = set()
    products = []
    for p in raw:
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        small = p.get("small_description")
        pricing, price_tag = _pricing(p.get("pricing"))
        item = {
            "asin": asin,
            "name": p["name"],
            "category": p["category"],
            "query": p["query"].lower().strip(),
            "product_category": p["product_category"],
            "Title": p["name"],
            "Description": p.get("full_description") or "",
            "BulletPoints": small if isinstance(small, list) else [small or ""],
            "pricing": pricing,
            "Price": price_tag,
            "options": _options(p.get("customization_options")),
            "Attributes": attributes.get(asin, {}).get("attributes", ["DUMMY_ATTR"]),
            "Reviews": [],
            "Rating": "N.A.",
            # what the synthetic goals are built from (WebShop reads them with human_goals=False)
            "instruction_text": attributes.get(asin, {}).get("instruction"),
            "instruction_attributes": attributes.get(asin, {}).get("instruction_attributes"),
        }
        if asin in human:
            item["instructions"] = human[asin]
        products.append(item)
    return products


def product_prices(products: list[dict], rng: random.Random) -> dict[str, float]:
    """One price per product: its single price, or uniform in its range."""
    out = {}
    for p in products:
        pricing = p["pricing"]
        out[p["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    return out


def human_goals(products: list[dict], prices: dict[str, float], rng: random.Random) -> list[dict]:
    """One goal per human instruction with attributes, its price cap from `price_clause`."""
    goals = []
    for item in products:
        for ins in item.get("instructions", []):
            attributes = ins["instruction_attributes"]
            if not attributes:
                continue
            price_upper, price_text = price_clause(prices[item["asin"]], rng)
            goals.append(
                {
                    "asin": item["asin"],
                    "category": item["category"],
                    "query": item["query"],
                    "name": item["name"],
                    "product_category": item["product_category"],
                    "instruction_text": ins["instruction"].strip(".") + price_text,
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": ins["instruction_options"],
                }
            )
    return goals


@dataclass
class Catalogue:
    """Products (WebShop's fields), their prices and the goals, in WebShop's order."""

    products: list[dict]
    prices: dict[str, float]
    goals: list[dict]
    source: str = ""
    by_asin: dict[str, dict] = field(init=False)

    def __post_init__(self):
        self.by_asin = {p["asin"]: p for p in self.products}

    @classmethod
    def from_dir(
        cls, data_dir: str | os.PathLike | None = None, seed: int = 0, goals: str = "human"
    ) -> Catalogue:
        """The shop in `data_dir` with prices and caps drawn from `seed`; `goals` "human" (WebShop's
        human instructions) or "synthetic" (its goals from every option combination), in WebShop's
        shuffled order either way."""
        if goals not in GOAL_KINDS:
            raise ValueError(f"goals={goals!r}: must be one of {', '.join(GOAL_KINDS)}")
        root = data_dir_of(data_dir)
        products = prepare_products(
            _read(root / PRODUCTS_FILE), _read(root / ATTRIBUTES_FILE), _read(root / HUMAN_FILE)
        )
        rng = random.Random(seed)
        prices = product_prices(products, rng)
        if goals == "human":
            made = human_goals(products, prices, rng)
        else:
            made = synthetic_goals(products, prices, rng)
        random.Random(GOAL_SHUFFLE_SEED).shuffle(made)
        return cls(products, prices, made, str(root))

    def split(self, name: str, test_goals: int = TEST_GOALS) -> list[int]:
        """Goal indices of a split: "test" the first `test_goals`, "train" the rest, "all" every goal."""
        n = len(self.goals)
        if name == "test":
            return list(range(min(test_goals, n)))
        if name == "train":
            return list(range(min(test_goals, n), n))
        if name == "all":
            return list(range(n))
        raise ValueError(f"unknown WebShop split {name!r}: use test, train or all")
