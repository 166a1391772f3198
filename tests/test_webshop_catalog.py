"""WebShop's file format: a tiny hand-written catalogue is loaded as WebShop loads it, then played."""

import json
import random

import pytest

from roleagent_jax.envs.webshop.catalog import (
    ATTRIBUTES_FILE,
    FILES,
    HUMAN_FILE,
    PRODUCTS_FILE,
    Catalogue,
    data_dir_of,
)
from roleagent_jax.envs.webshop.engine import WIN_REWARD, Shop, ShopSession
from roleagent_jax.envs.webshop.generate import generate


def _raw(asin, name, pricing, options, small, query="men's sneakers"):
    return {
        "asin": asin,
        "name": name,
        "full_description": f"{name}. A fine product.",
        "small_description": small,
        "pricing": pricing,
        "customization_options": options,
        "images": ["https://example.invalid/a.jpg"],
        "category": "fashion",
        "query": query.upper() + "  ",
        "product_category": "Clothing, Shoes & Jewelry › Men › Shoes",
        "brand": "dropped by the loader",
    }


def write_tiny_shop(folder):
    colors = [{"value": "Black", "image": None}, {"value": "Navy/White", "image": None}]
    sizes = [{"value": "9", "image": None}, {"value": "10", "image": None}]
    products = [
        _raw("B000000001", "Runa Non Slip Running Shoes", "$35.99", {"Color": colors, "Size": sizes},
             ["Rubber sole", "Lace up"]),
        _raw("B000000002", "Kato Leather Dress Shoes", "$20.00$30.00", {"Color": colors}, "Leather upper"),
        _raw("nan", "Broken Record", "$1.00", None, []),
        _raw("B000000001", "Duplicate Of The First", "$5.00", None, []),
        _raw("B0000000033", "Asin Too Long", "$5.00", None, []),
        _raw("B000000004", "Sola Garden Hose", "", None, ["50 ft"], query="garden hose"),
    ]  # fmt: skip
    attrs = {
        "B000000001": {"attributes": ["non slip", "rubber sole"]},
        "B000000002": {"attributes": ["leather"]},
    }
    human = {
        "B000000001": [
            {
                "asin": "B000000001",
                "instruction": "i need non slip running shoes with rubber sole, in navy | white color and size 10.",
                "instruction_attributes": ["non slip", "rubber sole"],
                "instruction_options": ["navy | white", "10"],
            },
            {
                "asin": "B000000001",
                "instruction": "skipped",
                "instruction_attributes": [],
                "instruction_options": [],
            },
        ],
        "B000000002": [
            {
                "asin": "B000000002",
                "instruction": "i want leather dress shoes",
                "instruction_attributes": ["leather"],
                "instruction_options": [],
            }
        ],
    }
    for name, data in ((PRODUCTS_FILE, products), (ATTRIBUTES_FILE, attrs), (HUMAN_FILE, human)):
        (folder / name).write_text(json.dumps(data))
    return folder


def test_loader_derives_webshop_fields(tmp_path):
    cat = Catalogue.from_dir(write_tiny_shop(tmp_path), seed=3)
    assert [p["asin"] for p in cat.products] == ["B000000001", "B000000002", "B000000004"]
    shoes = cat.by_asin["B000000001"]
    assert shoes["Title"] == "Runa Non Slip Running Shoes" and shoes["query"] == "men's sneakers"
    assert shoes["options"] == {"color": ["black", "navy | white"], "size": ["9", "10"]}
    assert shoes["Price"] == "$35.99" and cat.prices["B000000001"] == 35.99
    dress = cat.by_asin["B000000002"]
    assert dress["BulletPoints"] == ["Leather upper"] and dress["Price"] == "$20.0 to $30.0"
    assert 20.0 <= cat.prices["B000000002"] <= 30.0
    hose = cat.by_asin["B000000004"]
    assert hose["Attributes"] == ["DUMMY_ATTR"] and hose["Price"] == "$100.0" and "instructions" not in hose
    # goals: instructions without attributes are skipped; a price cap from the multiples of 10 above
    assert len(cat.goals) == 2
    g = next(g for g in cat.goals if g["asin"] == "B000000001")
    assert g["price_upper"] in (50.0, 60.0, 70.0)
    assert g["instruction_text"].endswith(f", and price lower than {g['price_upper']:.2f} dollars")
    assert not g["instruction_text"].startswith(".") and "size 10, and price" in g["instruction_text"]
    assert g["goal_options"] == ["navy | white", "10"] and g["name"] == shoes["name"]


def test_goal_order_is_webshops_shuffle(tmp_path):
    cat = Catalogue.from_dir(write_tiny_shop(tmp_path))
    unshuffled = sorted(cat.goals, key=lambda g: g["asin"])  # built in product order, then shuffled
    expected = list(unshuffled)
    random.Random(233).shuffle(expected)
    assert [g["asin"] for g in cat.goals] == [g["asin"] for g in expected]


def test_prices_depend_on_the_seed_only(tmp_path):
    folder = write_tiny_shop(tmp_path)
    a, b, c = (Catalogue.from_dir(folder, seed=s) for s in (1, 1, 2))
    assert a.prices == b.prices and [g["price_upper"] for g in a.goals] == [g["price_upper"] for g in b.goals]
    assert a.prices["B000000002"] != c.prices["B000000002"]


@pytest.mark.parametrize("missing", FILES)
def test_missing_file_is_named_with_the_setup_script(tmp_path, missing):
    write_tiny_shop(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"{missing}.*setup.sh"):
        data_dir_of(tmp_path)


def test_no_data_folder_says_where_to_get_it(monkeypatch):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="WEBSHOP_DATA.*setup.sh"):
        data_dir_of(None)


def test_data_folder_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WEBSHOP_DATA", str(write_tiny_shop(tmp_path)))
    assert data_dir_of(None) == tmp_path


def test_splits_first_500_test():
    cat = Catalogue([], {}, [{"asin": str(i)} for i in range(1203)])
    assert cat.split("test") == list(range(500)) and cat.split("train") == list(range(500, 1203))
    with pytest.raises(ValueError, match="valid"):
        cat.split("valid")


def test_play_the_tiny_shop(tmp_path):
    cat = Catalogue.from_dir(write_tiny_shop(tmp_path))
    session = ShopSession(Shop(cat))
    gi = next(i for i, g in enumerate(cat.goals) if g["asin"] == "B000000001")
    obs, info = session.reset(gi)
    assert obs == "WebShop [SEP] Search" and info["admissible_commands"] == ["search[<your query>]"]
    obs, *_ = session.step("search[non slip running shoes]")
    assert obs.startswith("Back to Search [SEP] Page 1 (Total results: ")
    assert "B000000001 [SEP] Runa Non Slip Running Shoes [SEP] $35.99" in obs
    obs, *_ = session.step("click[b000000001]")
    assert "color [SEP] black [SEP] navy | white [SEP] size [SEP] 9 [SEP] 10" in obs
    session.step("click[navy | white]")
    session.step("click[10]")
    obs, reward, done, info = session.step("click[Buy Now]")
    assert done and reward == WIN_REWARD and info["won"] and info["score"] == 1.0
    assert obs.startswith("Thank you for shopping with us!")
    # same product without the options: not a success, the raw score says how close
    session.reset(gi)
    for a in ("search[non slip running shoes]", "click[b000000001]", "click[buy now]"):
        _, reward, done, info = session.step(a)
    assert done and reward == 0.0 and info["score"] == pytest.approx(3 / 5)


def test_generated_shop_is_in_the_same_format(tmp_path):
    made = generate(tmp_path / "g", seed=5, n_products=50)
    raw = json.loads((tmp_path / "g" / PRODUCTS_FILE).read_text())
    assert len(raw) == 50 and set(raw[0]) >= {"asin", "name", "pricing", "customization_options", "query"}
    cat = Catalogue.from_dir(made.folder)
    assert len(cat.products) == 50 and len(cat.goals) == 50
    assert all(g["goal_options"] and g["attributes"] for g in cat.goals)
    again = generate(tmp_path / "h", seed=5, n_products=50)
    assert (tmp_path / "h" / PRODUCTS_FILE).read_text() == (tmp_path / "g" / PRODUCTS_FILE).read_text()
    assert again.family_of == made.family_of
    other = generate(tmp_path / "i", seed=6, n_products=50)
    assert (tmp_path / "i" / PRODUCTS_FILE).read_text() != (tmp_path / "g" / PRODUCTS_FILE).read_text()
    assert other.folder.is_dir()


def test_real_split_of_the_tiny_shop_through_the_family(tmp_path):
    from roleagent_jax.envs.registry import get_family

    fam = get_family("webshop")
    human = {"protocol": "webshop"}  # the tiny shop has human instructions only
    pool = fam.task_pool("test", data_dir=write_tiny_shop(tmp_path), options=human)
    assert len(pool) == 2 and not pool.expert_plans and set(pool.task_types) == {"fashion"}
    assert len(fam.task_pool("train", data_dir=tmp_path, options=human)) == 0  # under 500 goals: all test
    env = fam.make_env(15)
    for task in pool.tasks:
        obs = env.reset(task, expert=True)
        while not obs.done:
            obs = env.step(obs.expert_plan[0])
        assert obs.won and obs.score == 1.0, task.goal
