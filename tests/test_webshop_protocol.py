"""WebShop plays the reference runs' protocol by default: synthetic goals equal to WebShop's own, the
paper's splits, the Lucene-like product index and the reference prompt and format rule."""

import itertools
import json
import random
import re
from collections import defaultdict
from decimal import Decimal

import pytest

from roleagent_jax.envs.registry import get_family
from roleagent_jax.envs.webshop.catalog import ATTRIBUTES_FILE, PRODUCTS_FILE, Catalogue
from roleagent_jax.envs.webshop.generate import generate
from roleagent_jax.envs.webshop.search import SearchIndex


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A generated catalogue in WebShop's file format (items_ins_v2 carries instructions)."""
    return generate(tmp_path_factory.mktemp("shop") / "s", seed=3, n_products=200).folder


# ----- WebShop's goal code, as a handful of lines written afresh from web_agent_site/engine -----------

PRICE_RANGE = [10.0 * i for i in range(1, 100)]


def webshop_products(folder):
    """The fields `get_synthetic_goals` reads, loaded as WebShop's `load_products` loads them."""
    raw = json.loads((folder / PRODUCTS_FILE).read_text())
    attributes = json.loads((folder / ATTRIBUTES_FILE).read_text())
    products, seen = [], set()
    for p in raw:
        if p["asin"] == "nan" or len(p["asin"]) > 10 or p["asin"] in seen:
            continue
        seen.add(p["asin"])
        options = {}
        for name, contents in (p["customization_options"] or {}).items():
            if contents is not None:
                options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
        pricing = p.get("pricing")
        pricing = (
            [float(Decimal(re.sub(r"[^\d.]", "", x))) for x in pricing.split("$")[1:]] if pricing else [100.0]
        )
        products.append(
            dict(p, query=p["query"].lower().strip(), options=options, pricing=pricing,
                 instruction_text=attributes[p["asin"]].get("instruction"),
                 instruction_attributes=attributes[p["asin"]].get("instruction_attributes"))
        )  # fmt: skip
    return products


def webshop_synthetic_goals(products, rng):
    """generate_product_prices + get_synthetic_goals + the server's seeded shuffle, `random` as `rng`."""
    prices = {
        p["asin"]: p["pricing"][0] if len(p["pricing"]) == 1 else rng.uniform(*p["pricing"][:2])
        for p in products
    }
    goals, count = [], defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        price_range = [p for p in PRICE_RANGE if p > prices[product["asin"]]][:4]
        if len(price_range) >= 2:
            _, price_upper = sorted(rng.sample(price_range, 2))
            price_text = f", and price lower than {price_upper:.2f} dollars"
        else:
            price_upper, price_text = 1000000, ""
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = {names[i]: o for i, o in enumerate(combination)}
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"], "category": product["category"], "query": product["query"],
                "name": product["name"], "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text'].strip('.')}{option_text}{price_text}",
                "attributes": product["instruction_attributes"], "price_upper": price_upper,
                "goal_options": goal_options,
            })  # fmt: skip
            for att in product["instruction_attributes"]:
                count[att] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / count[a] for a in goal["attributes"]) / len(goal["attributes"])
    random.Random(233).shuffle(goals)
    return goals


@pytest.mark.parametrize("seed", [0, 7])
def test_synthetic_goals_equal_webshops_own(shop, seed):
    expected = webshop_synthetic_goals(webshop_products(shop), random.Random(seed))
    got = Catalogue.from_dir(shop, seed=seed, goals="synthetic").goals
    assert len(got) == len(expected) > 1000  # every option combination of every product
    assert got == expected


def test_paper_protocol_splits(shop):
    family = get_family("webshop")  # protocol "paper" by default
    test, train = (family.task_pool(s, data_dir=shop) for s in ("test", "train"))
    goals = Catalogue.from_dir(shop, goals="synthetic").goals
    test_ids = [int(t.id.split(":")[0]) for t in test.tasks]
    assert len(test) == 256 and len(set(test_ids)) == 256 and max(test_ids) < 500
    assert test_ids == [
        int(t.id.split(":")[0]) for t in family.task_pool("test", data_dir=shop).tasks
    ]  # fixed
    assert [int(t.id.split(":")[0]) for t in train.tasks] == list(range(500, len(goals)))
    assert [t.goal for t in test.tasks] == [goals[i]["instruction_text"] for i in test_ids]
    human = family.task_pool("test", data_dir=shop, options={"protocol": "webshop"})
    assert len(human) == 200 and human.goals == [
        g["instruction_text"] for g in Catalogue.from_dir(shop).goals
    ]
    env = family.configured({}).make_env(15)
    for task in test.tasks[:8]:  # the synthetic goals are winnable through the Lucene-like search
        obs = env.reset(task, expert=True)
        while not obs.done:
            obs = env.step(obs.expert_plan[0])
        assert obs.won, task.goal


def test_lucene_index_stems_and_reads_the_first_bullet_only():
    products = [
        {"asin": "A", "Title": "Trail runner", "Description": "", "BulletPoints": ["light", "waterproof"]},
        {"asin": "B", "Title": "Sock", "Description": "", "BulletPoints": ["running sock"]},
    ]
    lucene, plain = SearchIndex(products, "lucene"), SearchIndex(products, "plain")
    assert lucene.search("runners") == ["A"] and plain.search("runners") == []  # Porter: runner
    assert lucene.search("socks") == ["B"] and plain.search("socks") == []
    assert lucene.search("waterproof") == [] and plain.search("waterproof") == ["A"]
    with pytest.raises(ValueError, match="search_index='bm42'"):
        SearchIndex(products, "bm42")


def test_reference_prompt_and_format_rule():
    family = get_family("webshop")
    results = (
        "Back to Search [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B0A [SEP] " + "Red socks " * 30
    )
    available = ["click[back to search]", "click[next >]", "click[b0a]"]
    first = family.agent_prompt(
        "i need red socks", [], "WebShop [SEP] Search", ["search[<your query>]"], 0, 2
    )
    assert "Your task is to: i need red socks.\nYour current observation is: 'Search'.\n" in first
    assert "[\n'search[<your query>]',\n]" in first and "Prior to this step" not in first
    later = family.agent_prompt("i need red socks", [("WebShop [SEP] Search", "search[red socks]")], results,
                                available, 1, 2)  # fmt: skip
    assert "[Observation 1: ''Search'', Action 1: 'search[red socks]']" in later
    assert (
        "current observation is: 'Back to Search' [SEP] 'Page 1 (Total results: 2)' [SEP] 'Next >'" in later
    )
    assert "'click[back to search]',\n'click[next >]',\n'click[b0a]',\n]" in later
    history = [("WebShop [SEP] Search", "search[red socks]"), (results, "click[b0a]")]
    whole = family.agent_prompt("g", history, "Back to Search", available, 2, 2)
    cut = family.configured({"history_chars": 160}).agent_prompt(
        "g", history, "Back to Search", available, 2, 2
    )
    assert "Red socks " * 29 in whole and "Red socks " * 29 not in cut
    # valid = <think> and <action> present; whether the action is available plays no part
    assert family.parse_action("<think>t</think><action>click[B0A]</action>", available) == (
        "click[b0a]",
        True,
    )
    assert family.parse_action("<think>t</think><action>click[b0z]</action>", available) == (
        "click[b0z]",
        True,
    )
    assert family.parse_action("<action>click[b0a]</action>", available) == ("click[b0a]", False)
    assert family.parse_action("click[b0a]", available) == (None, False)
    compact = family.configured({"valid": "available"})
    assert compact.parse_action("<think>t</think><action>click[b0z]</action>", available) == (
        "click[b0z]",
        False,
    )


def test_bad_options_name_the_key_and_value():
    family = get_family("webshop")
    for options, message in (
        ({"protocol": "human"}, "protocol='human'"),
        ({"search_index": "bm25"}, "search_index='bm25'"),
        ({"history_chars": -5}, "history_chars=-5"),
        ({"prompt": "short"}, "prompt='short'"),
    ):
        with pytest.raises(ValueError, match=message):
            family.configured(options)
