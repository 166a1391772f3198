"""The shop engine on a generated shop: pages, actions, episode end, search, expert and random play."""

import random

import pytest

from roleagent_jax.envs.webshop.catalog import Catalogue
from roleagent_jax.envs.webshop.engine import (
    PAGE_SIZE,
    SEARCH_PLACEHOLDER,
    WIN_REWARD,
    Shop,
    ShopSession,
    expert_action,
    goal_words,
    split_action,
)
from roleagent_jax.envs.webshop.generate import generate


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    made = generate(tmp_path_factory.mktemp("shop"), seed=0, n_products=400)
    return Shop(Catalogue.from_dir(made.folder))


def _results_session(shop):
    s = ShopSession(shop)
    s.reset(0)
    s.step("search[black]")
    return s


def test_results_pages_next_prev_and_back(shop):
    s = _results_session(shop)
    assert len(s.state.results) == 50
    obs = s.render()
    assert obs.startswith("Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] ")
    assert obs.count("[SEP] $") == PAGE_SIZE  # ten products with their prices
    assert "click[< prev]" not in s.admissible()
    assert s.admissible()[:2] == ["click[back to search]", "click[next >]"]
    first_page = [a for a in s.admissible() if a.startswith("click[b0")]
    assert len(first_page) == PAGE_SIZE
    s.step("click[Next >]")
    assert "Page 2 (Total" in s.render() and "click[< prev]" in s.admissible()
    assert not set(first_page) & set(s.admissible())
    s.step("click[< prev]")
    assert [a for a in s.admissible() if a.startswith("click[b0")] == first_page
    s.step("click[back to search]")
    assert s.render() == "WebShop [SEP] Search" and s.admissible() == [SEARCH_PLACEHOLDER]


def test_item_page_options_subpages_and_prev(shop):
    s = _results_session(shop)
    asin = s.state.results[0]
    obs, *_ = s.step(f"click[{asin.lower()}]")
    product = shop.catalogue.by_asin[asin]
    assert obs.endswith("Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert product["Title"] in obs and f"Price: {product['Price']}" in obs
    for name, values in product["options"].items():
        assert f"{name} [SEP] {' [SEP] '.join(values)}" in obs
        assert f"click[{values[-1]}]" in s.admissible()
    name, values = next(iter(product["options"].items()))
    after, *_ = s.step(f"click[{values[-1]}]")
    assert after == obs and s.state.options == {name: values[-1]}  # simple text mode shows no selection
    feat, *_ = s.step("click[features]")
    assert feat.startswith("Back to Search [SEP] < Prev [SEP] ") and product["BulletPoints"][0] in feat
    back, *_ = s.step("click[< prev]")
    assert back == obs and s.state.options == {name: values[-1]}
    s.step("click[< prev]")
    assert s.state.page == "results" and s.state.options == {}


def test_invalid_actions_change_nothing_and_steps_run_out(shop):
    s = ShopSession(shop, max_steps=3)
    obs, _ = s.reset(1)
    for action in ("click[buy now]", "jump", "search[]"):
        after, reward, done, info = s.step(action)
        assert after == obs and reward == 0.0
    assert done and info["step"] == 3 and not info["won"] and info["admissible_commands"] == []
    assert s.step("search[black]")[2] is True  # stepping a finished episode changes nothing
    with pytest.raises(ValueError, match="out of range"):
        s.reset(10_000)
    with pytest.raises(ValueError, match="max_steps"):
        ShopSession(shop, max_steps=0)


def test_search_works_from_any_page_and_is_deterministic(shop):
    s = _results_session(shop)
    s.step(f"click[{s.state.results[0].lower()}]")
    s.step("SEARCH[ Black  Running Shoes ]")
    assert s.state.page == "results" and s.state.keywords == "black running shoes"
    assert shop.index.search("black running shoes") == s.state.results
    assert shop.index.search("your query") == [] and shop.index.search("and the") == []


def test_search_ranks_the_title_match_first(shop):
    for p in shop.catalogue.products[:20]:
        assert shop.index.search(p["Title"])[0] == p["asin"]


def test_split_action_and_goal_words():
    assert split_action(" click[ Buy  Now ] ") == ("click", "Buy Now")
    assert split_action("search[]") is None and split_action("look") is None
    assert goal_words("i need red socks, and price lower than 30.00 dollars") == "i need red socks"


def test_buy_scores_and_rewards(shop):
    s = ShopSession(shop)
    s.reset(2)
    while not s.done:
        s.step(expert_action(s))
    assert s.state.score == 1.0 and s.state.asin == s.goal["asin"]
    assert "Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP] Reward Details" in s.render()


def _play(shop, goals, choose):
    s = ShopSession(shop)
    won = 0
    for gi in goals:
        _, info = s.reset(gi)
        rng = random.Random(gi)
        reward = 0.0
        while not s.done:
            _, reward, _, info = s.step(choose(s, info, rng))
        won += reward == WIN_REWARD
    return won / len(goals)


def test_expert_wins_and_random_loses(shop):
    goals = list(range(200))
    assert _play(shop, goals, lambda s, info, rng: expert_action(s)) >= 0.95
    assert _play(shop, goals, lambda s, info, rng: rng.choice(info["admissible_commands"])) < 0.05


def test_search_keywords_are_the_goals_content_words():
    from roleagent_jax.envs.webshop.engine import search_keywords

    text = "i'm looking for a non slip running shoes with rubber sole, in black color and size 9, and price lower than 60.00 dollars"
    assert search_keywords(text) == "non slip running shoes rubber sole black 9"
