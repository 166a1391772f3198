"""The WebShop family: registration, splits, the env adapter, prompts, parser and the failure analyser."""

import pytest

from roleagent_jax.envs.base import Family, Task
from roleagent_jax.envs.registry import get_family, registered
from roleagent_jax.envs.webshop.heuristic import RULE_ORDER, analyse
from roleagent_jax.envs.webshop.prompts import build_agent_prompt, parse_action
from roleagent_jax.envs.webshop.taxonomy import FAILURE_TYPES
from roleagent_jax.types import Step, Trajectory


@pytest.fixture(scope="module")
def fam():
    return get_family("webshop")


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gen")


def _pool(fam, gen_dir, split, n=20, seed=0):
    return fam.task_pool(split, gen_dir=gen_dir, n=n, seed=seed, options={"n_products": 200})


def test_registered(fam):
    assert "webshop" in registered() and isinstance(fam, Family) and fam.has_expert
    assert len(FAILURE_TYPES) == 11 and set(RULE_ORDER) == set(FAILURE_TYPES)


def test_generated_splits_are_disjoint_and_deterministic(fam, gen_dir):
    splits = ("gen_test", "gen_valid", "gen_train", "gen_unseen")
    test, valid, train, unseen = (_pool(fam, gen_dir, s) for s in splits)
    ids = [{t.id for t in p.tasks} for p in (test, valid, train, unseen)]
    assert all(len(x) == 20 for x in ids) and not any(a & b for i, a in enumerate(ids) for b in ids[i + 1 :])
    # the held-out half of the seen families' goals, cut in two: the reported panel and the validation slice
    whole = [len(_pool(fam, gen_dir, s, n=0).tasks) for s in splits[:3]]
    assert whole[0] + whole[1] == whole[2] and abs(whole[0] - whole[1]) <= 1
    assert [t.id for t in _pool(fam, gen_dir, "gen_test").tasks] == [t.id for t in test.tasks]
    assert [t.goal for t in _pool(fam, gen_dir, "gen_test", seed=1).tasks] != test.goals
    assert set(test.task_types) <= set(fam.task_types)
    assert all(t.expert_plan and t.expert_plan[-1] == "click[buy now]" for t in test.tasks)
    with pytest.raises(ValueError, match="n_products"):
        _pool(fam, gen_dir, "gen_unseen", n=10_000)
    with pytest.raises(ValueError, match="known: test, train"):
        fam.task_pool("valid", gen_dir=gen_dir)
    with pytest.raises(ValueError, match="unknown option"):
        fam.task_pool("gen_test", gen_dir=gen_dir, options={"rooms": 3})


def test_goals_per_product_puts_new_instructions_on_trained_products_in_the_test_split(fam, gen_dir):
    opts = {"n_products": 50, "goals_per_product": 4}
    test, valid, train = (
        fam.task_pool(s, gen_dir=gen_dir, seed=0, options=opts).tasks
        for s in ("gen_test", "gen_valid", "gen_train")
    )
    # 40 products of seen families x 4 instructions: a quarter, a quarter, a half
    assert len(test) == len(valid) == 40 and len(train) == 80
    asin = lambda t: t.id.split(":")[1]  # noqa: E731
    trained = {asin(t) for t in train}
    shared = [t for t in test if asin(t) in trained]
    assert len(shared) > len(test) // 2  # most held-out goals are on products trained on...
    goals = {(asin(t), t.goal) for t in train}
    assert not any((asin(t), t.goal) in goals for t in shared)  # ...with instructions never trained on
    per_product = {}
    for t in test + valid + train:
        per_product.setdefault(asin(t), set()).add(t.goal)
    assert max(len(g) for g in per_product.values()) == 4 and len(per_product) == 40
    assert all(t.expert_plan and t.expert_plan[-1] == "click[buy now]" for t in test + train)
    one = fam.task_pool("gen_test", gen_dir=gen_dir, seed=0, options={"n_products": 50}).tasks
    assert len(one) == 10 and {asin(t) for t in one} <= set(per_product)  # same products, one goal each
    with pytest.raises(ValueError, match="goals_per_product"):
        fam.task_pool("gen_test", gen_dir=gen_dir, options={"n_products": 50, "goals_per_product": 0})


def test_shop_seed_gives_every_seed_the_same_shop(fam, gen_dir):
    """A trainer draws evaluation's tasks with another seed than training's: shop_seed keeps one shop."""
    opts = {"n_products": 50, "goals_per_product": 4, "shop_seed": 0}
    train = fam.task_pool("gen_train", gen_dir=gen_dir, seed=0, options=opts).tasks
    test = fam.task_pool("gen_test", gen_dir=gen_dir, seed=1000, options=opts).tasks
    assert [t.goal for t in test] == [
        t.goal for t in fam.task_pool("gen_test", gen_dir=gen_dir, seed=0, options=opts).tasks
    ]
    assert {t.id for t in test}.isdisjoint(t.id for t in train)
    assert {t.id.split(":")[1] for t in test} & {t.id.split(":")[1] for t in train}
    other = fam.task_pool("gen_test", gen_dir=gen_dir, seed=1000, options={**opts, "shop_seed": -1}).tasks
    assert {t.id.split(":")[1] for t in other}.isdisjoint(t.id.split(":")[1] for t in train)


def test_real_split_without_data_says_where_to_get_it(fam, monkeypatch):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="setup.sh"):
        fam.task_pool("test")


def test_env_plays_a_stored_plan_and_reports_score(fam, gen_dir):
    task = _pool(fam, gen_dir, "gen_test", n=3).tasks[2]
    env = fam.make_env(15)
    obs = env.reset(task, expert=True)
    assert obs.text == obs.anchor == "WebShop [SEP] Search" and obs.admissible == ["search[<your query>]"]
    assert obs.expert_plan == [task.expert_plan[0]]
    states, choices = [], 0
    for action in task.expert_plan:
        before = obs
        obs = env.step(action)
        states.append(obs.state)
        if action.startswith("click[") and obs.info["page"] == "item" and before.info["page"] == "item":
            # an option chosen: the page reads the same (WebShop's simple mode), the state does not
            assert obs.text == before.text and obs.state != before.state
            choices += 1
    assert obs.done and obs.won and obs.reward == 10.0 and obs.score == 1.0 and obs.expert_plan == []
    assert len(set(states)) == len(states) and choices >= 1
    obs = env.reset(task)
    assert obs.expert_plan is None and obs.score == 0.0
    with pytest.raises(ValueError, match="goal reference"):
        env.reset(Task("x", "food", "g", payload="nope"))


def test_page_size_option_shortens_results_pages_and_the_expert_still_wins(fam, gen_dir):
    opts = {"n_products": 200, "page_size": 3}
    tasks = fam.task_pool("gen_test", gen_dir=gen_dir, n=20, seed=0, options=opts).tasks
    default = _pool(fam, gen_dir, "gen_test").tasks
    assert [t.id for t in tasks] == [t.id for t in default]  # the same goals, paged differently
    env = fam.make_env(15)
    wins, lengths = 0, []
    for task in tasks:
        obs = env.reset(task)
        for action in task.expert_plan:
            obs = env.step(action)
            if obs.info["page"] == "results":
                lengths.append(sum(a.startswith("click[b0") for a in obs.admissible))
        wins += obs.won
    assert wins == len(tasks) and lengths and max(lengths) == 3
    env.reset(tasks[0])
    first = [a for a in env.step(tasks[0].expert_plan[0]).admissible if a.startswith("click[b0")]
    obs = env.step("click[next >]")
    second = [a for a in obs.admissible if a.startswith("click[b0")]
    assert "Page 2" in obs.text and len(second) == 3 and not set(first) & set(second)
    with pytest.raises(ValueError, match="page_size"):
        fam.task_pool("gen_test", gen_dir=gen_dir, n=2, options={**opts, "page_size": 0})


def test_parse_action():
    page = ["click[back to search]", "click[next >]", "click[b0abc]"]
    assert parse_action("<think>x</think><action>click[Next >]</action>", page) == ("click[next >]", True)
    assert parse_action("<action> click[ B0ABC ]", page) == ("click[b0abc]", True)  # cut stop string
    assert parse_action("<action>click[b0zzz]</action>", page) == ("click[b0zzz]", False)
    assert parse_action("<action>search[red socks]</action>", page) == ("search[red socks]", False)
    bar = ["search[<your query>]"]
    assert parse_action("<action>search[ Red  socks ]</action>", bar) == ("search[Red socks]", True)
    assert parse_action("<action>search[<your query>]</action>", bar) == ("search[<your query>]", False)
    assert parse_action("<action>search[your query]</action>", None) == ("search[your query]", True)
    for bad in (
        "click[x]",
        "<action>buy</action>",
        "<action>a</action><action>b</action>",
        None,
        "<action></action>",
    ):
        assert parse_action(bad, page) == (None, False)


def test_agent_prompt_structure(fam):
    history = [
        ("WebShop [SEP] Search", "search[red socks]"),
        ("Back to Search [SEP] Page 1 " + "x" * 500, "click[b0a]"),
    ]
    compact = fam.configured({"prompt": "compact", "history_chars": 160})
    p = compact.agent_prompt(
        "i need red socks", history, "Back to Search [SEP] < Prev", ["click[buy now]"], 2, 1
    )
    assert "Instruction: i need red socks" in p and "Step 3. Your last 1 steps:" in p
    assert "[2] Did: click[b0a]" in p and "search[red socks]" not in p and "x" * 200 not in p
    assert "Page: Back to Search [SEP] < Prev" in p and "Actions: click[buy now]" in p
    assert p.rstrip().endswith("(to search, write search[your keywords]).") and "<action>" in p
    assert "No actions yet." in build_agent_prompt("g", [], "WebShop [SEP] Search", None, 0)
    wia = fam.predictor_prompt("i need red socks", [], "WebShop [SEP] Search", "search[red socks]", 1)
    assert "shop website" in wia and "<obs1>" in wia


def test_abstract_goal(fam):
    g = "i need a red t-shirt in size 10, and price lower than 30.00 dollars"
    assert fam.abstract_goal(g, "fashion") == "i need a red t-shirt in size N, and price lower than N dollars"


# ----- heuristic analyser on constructed trajectories ------------------------------------------------

GOAL = "i need non slip running shoes with rubber sole, in black color and size 9, and price lower than 60.00 dollars"
SEARCH, RESULTS = (
    "WebShop [SEP] Search",
    "Back to Search [SEP] Page 1 (Total results: 3) [SEP] Next > [SEP] B0A",
)
ITEM = "Back to Search [SEP] < Prev [SEP] color [SEP] black [SEP] Title [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
SUB = "Back to Search [SEP] < Prev [SEP] some text"


def _done(r_type=1.0, attrs=(2, 2), opts=(2, 2), price="yes"):
    return (
        "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 0.5 [SEP] Reward Details [SEP] "
        f"product type: {r_type} [SEP] attributes matched: {attrs[0]}/{attrs[1]} [SEP] "
        f"options matched: {opts[0]}/{opts[1]} [SEP] price within limit: {price}"
    )


def _traj(moves, won=False):
    steps = [Step(o, [], "", a, a is not None, 0.0, n) for o, a, n in moves]
    return Trajectory(0, "fashion", GOAL, steps, won=won)


def _buy(done, options=("click[black]", "click[9]"), query="non slip running shoes rubber sole"):
    moves = [(SEARCH, f"search[{query}]", RESULTS), (RESULTS, "click[b0a]", ITEM)]
    moves += [(ITEM, o, ITEM) for o in options] + [(ITEM, "click[buy now]", done)]
    return _traj(moves)


@pytest.mark.parametrize(
    "traj,expected",
    [
        (_buy(_done(r_type=0.5), query="garden hose"), "wrong_search_terms"),
        (_buy(_done(r_type=0.5)), "wrong_item"),
        (_buy(_done(attrs=(1, 2))), "missing_attribute"),
        (_buy(_done(opts=(1, 2)), options=("click[black]",)), "option_not_chosen"),
        (_buy(_done(opts=(1, 2))), "wrong_option"),
        (_buy(_done(price="no")), "over_budget"),
        (_traj([(SEARCH, None, SEARCH)] * 4), "action_format_error"),
        (_traj([(SEARCH, "click[search]", SEARCH)] * 15), "no_search"),
        (_traj([(SEARCH, "search[lamp]", RESULTS)] + [(RESULTS, "click[next >]", RESULTS)] * 14), "wrong_search_terms"),
        (_traj([(SEARCH, "search[running shoes rubber sole]", RESULTS)] + [(RESULTS, "click[next >]", RESULTS)] * 14), "paging_loop"),
        (
            _traj(
                [(SEARCH, "search[running shoes rubber sole]", RESULTS)]
                + [(RESULTS, f"click[b0{i}]", ITEM) if k == 0 else (ITEM, "click[< prev]", RESULTS) for i in range(5) for k in range(2)]
            ),
            "item_hopping",
        ),
        (
            _traj([(SEARCH, "search[running shoes rubber sole]", RESULTS), (RESULTS, "click[b0a]", ITEM)]
                  + [(ITEM, "click[features]", SUB), (SUB, "click[< prev]", ITEM)] * 6 + [(ITEM, "click[black]", ITEM)]),
            "item_hopping",
        ),
        (_traj([(SEARCH, "search[running shoes rubber sole]", RESULTS), (RESULTS, "click[b0a]", ITEM)] + [(ITEM, "click[black]", ITEM)] * 13), "never_bought"),
    ],
)  # fmt: skip
def test_heuristic_labels(traj, expected):
    report = analyse(traj, 15)
    assert report.failure_type == expected, report.detail
    assert report.critical_step is not None and report.source == "heuristic"
    assert "fashion purchase" in report.query and "shoes" not in report.lesson + report.query


def test_heuristic_leaves_wins_alone():
    won = _buy(_done())
    won.won = True
    assert analyse(won, 15).failure_type == "unknown"


def test_family_analyse_failure(fam):
    assert fam.analyse_failure(_buy(_done(price="no")), 15).failure_type == "over_budget"


def test_evaluate_cli_prints_success_and_score(tmp_path, capsys):
    from roleagent_jax.evaluation import cli

    common = ["--env=webshop", "--split=gen_test", "--gen-n=10", f"--gen-dir={tmp_path}", "--max-steps=15"]
    common += ["--n-products=100", "--num-workers=1"]
    expert = cli.main([*common, "--policy=expert"])
    out = capsys.readouterr().out.strip().splitlines()
    assert "score 100.0%" in out[-2] and out[-1].startswith("{")
    assert expert["n"] == 10 and expert["success"] == 1.0 and expert["score"] == 1.0
    assert set(expert["per_type_score"]) == set(expert["per_type"])
    rand = cli.main([*common, "--policy=random", "--quiet"])
    assert rand["success"] < 0.05 and rand["score"] < 0.5
