"""The ALFWorld backend on the real games of ../shared/data/alfworld (skipped when they are absent)."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from textworld_reference import transcript

from roleagent_jax.envs import TaskPool, get_family
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv
from roleagent_jax.envs.alfworld.games import TASK_TYPES, WIN_REWARD, split_dir, task_type_of
from roleagent_jax.evaluation.panel import ExpertPolicy, RandomPolicy, evaluate

ALFWORLD = get_family("alfworld")

EXPECTED_COUNTS = {
    "pick_and_place_simple": 35,
    "look_at_obj_in_light": 13,
    "pick_clean_then_place_in_recep": 27,
    "pick_heat_then_place_in_recep": 16,
    "pick_cool_then_place_in_recep": 25,
    "pick_two_obj_and_place": 24,
}


@pytest.fixture(scope="module")
def valid_seen(alfworld_data) -> TaskPool:
    return ALFWORLD.task_pool("valid_seen", data_dir=alfworld_data)


def game_files(pool: TaskPool) -> list[str]:
    return [t.payload for t in pool.tasks]


# One game per type whose planner solution is cheap to compute (big kitchens take seconds of CPU).
FAST_GAMES = (
    "pick_and_place_simple-SprayBottle-None-Toilet-418",
    "look_at_obj_in_light-Bowl-None-DeskLamp-316",
    "pick_clean_then_place_in_recep-SoapBar-None-Toilet-410",
    "pick_heat_then_place_in_recep-Apple-None-DiningTable-26",
    "pick_cool_then_place_in_recep-Apple-None-CounterTop-14",
    "pick_two_obj_and_place-AlarmClock-None-Dresser-305",
)


def first_of_each_type(pool: TaskPool) -> list[int]:
    """The FAST_GAMES (first of its type when a folder is missing), in TASK_TYPES order."""
    out = []
    for task_type, folder in zip(TASK_TYPES, FAST_GAMES):
        hits = [i for i, f in enumerate(game_files(pool)) if f"/{folder}/" in f]
        out.append(hits[0] if hits else pool.task_types.index(task_type))
    return out


def test_valid_seen_counts_and_order(valid_seen):
    assert len(valid_seen) == 140
    assert Counter(valid_seen.task_types) == EXPECTED_COUNTS
    assert game_files(valid_seen) == sorted(game_files(valid_seen))
    for f, t, g in zip(game_files(valid_seen), valid_seen.task_types, valid_seen.goals):
        assert f.endswith("game.tw-pddl") and t == task_type_of(f) and g.endswith(".")


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        ALFWORLD.task_pool("valid_seen", data_dir=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        split_dir(None, "valid_seen")


def test_expert_wins_one_game_per_type(valid_seen):
    env = AlfWorldEnv(max_steps=50)
    for i in first_of_each_type(valid_seen):
        obs = env.reset(valid_seen[i], expert=True)
        assert obs.info["goal"] == valid_seen.goals[i] and obs.info["task_type"] == valid_seen.task_types[i]
        assert obs.anchor == obs.text and not obs.won and not obs.failed
        total = 0.0
        while not obs.done:
            assert obs.expert_plan[0] in obs.admissible
            obs = env.step(obs.expert_plan[0])
            total += obs.reward
        assert obs.won and total == WIN_REWARD, valid_seen[i].payload
        assert obs.info["step"] <= 20


def test_reset_loads_exactly_the_requested_game(valid_seen):
    env = AlfWorldEnv(max_steps=5)
    a, b = first_of_each_type(valid_seen)[:2]
    obs_a = env.reset(valid_seen[a])
    env.step(obs_a.admissible[0])
    obs_b = env.reset(valid_seen[b])
    assert obs_b.info["goal"] == valid_seen.goals[b] != valid_seen.goals[a]
    again = env.reset(valid_seen[a])  # back to the first game's initial state
    assert again.text == obs_a.text and again.admissible == obs_a.admissible


def test_cached_engine_matches_plain_textworld(valid_seen):
    """Cached resets and memoized parsers must play exactly like textworld's own uncached PddlEnv under
    alfworld's wrappers, run in a process of its own (ours changes textworld in this one)."""
    game = game_files(valid_seen)[first_of_each_type(valid_seen)[0]]
    ref = transcript(game, 7, 3, 8)
    ours = AlfWorldEnv(max_steps=50)
    for _ in range(2):  # second round uses the cached translation
        obs = ours.reset(game)
        assert [obs.text, obs.admissible] == ref[0]
        for k in range(8):
            cmds = obs.admissible
            obs = ours.step(cmds[(7 * k + 3) % len(cmds)])
            assert [obs.text, obs.admissible] == ref[k + 1]


def test_episode_ends_at_max_steps_and_stays_done(valid_seen):
    env = AlfWorldEnv(max_steps=3)
    env.reset(valid_seen[0])
    dones = [env.step("look").done for _ in range(3)]
    assert dones == [False, False, True]
    after = env.step("look")
    assert after.done and after.reward == 0.0 and after.info["step"] == 3


def test_random_fails_where_expert_wins(valid_seen):
    """A few fixed games of the harder types: the expert wins all, the random policy none."""
    ids = first_of_each_type(valid_seen)
    sub = valid_seen.subset([ids[2], ids[5]])  # clean, pick two
    expert = evaluate(ExpertPolicy(ALFWORLD), ALFWORLD, sub, "valid_seen", num_workers=1, max_steps=50)
    random_ = evaluate(RandomPolicy(ALFWORLD, 0), ALFWORLD, sub, "valid_seen", num_workers=1, max_steps=25)
    assert expert["success"] == 1.0 and expert["n"] == 2
    assert random_["success"] == 0.0 and random_["invalid_rate"] == 0.0


@pytest.mark.slow
def test_expert_and_random_on_all_of_valid_seen(valid_seen):
    expert = evaluate(ExpertPolicy(ALFWORLD), ALFWORLD, valid_seen, "valid_seen", num_workers=2, max_steps=50)
    assert expert["n"] == 140 and expert["success"] >= 0.95, json.dumps(expert)
    random_ = evaluate(
        RandomPolicy(ALFWORLD, 0), ALFWORLD, valid_seen, "valid_seen", num_workers=2, max_steps=50
    )
    assert random_["n"] == 140 and random_["success"] < 0.10, json.dumps(random_)


def test_data_2_1_3_verbs(valid_seen, tmp_path):
    """The same real game written with the packaged (2.1.3) domain and grammar: 'move X to Y' and 'help'
    replace 'put X in/on Y', and the backend and expert follow without knowing the verb."""
    from roleagent_jax.envs.alfworld import procgen

    src = Path(game_files(valid_seen)[first_of_each_type(valid_seen)[0]])
    game = json.loads(src.read_text())
    goal = valid_seen.goals[first_of_each_type(valid_seen)[0]].rstrip(".")
    game["grammar"] = procgen.GRAMMAR_FILE.read_text().replace("UNKNOWN GOAL", goal)
    game["pddl_domain"] = procgen.DOMAIN_FILE.read_text()
    dst = tmp_path / "json_2.1.1" / "valid_seen" / src.parent.parent.name / src.parent.name
    dst.mkdir(parents=True)
    (dst / "game.tw-pddl").write_text(json.dumps(game))
    shutil.copy(src.parent / "traj_data.json", dst / "traj_data.json")
    pool = ALFWORLD.task_pool("valid_seen", data_dir=tmp_path)
    assert pool.goals == [goal + "."]
    env = AlfWorldEnv()
    obs = env.reset(pool[0], expert=True)
    assert "help" in obs.admissible
    assert any(c.startswith("move ") for c in obs.expert_plan)
    assert not any(c.startswith("put ") for c in obs.expert_plan)
    while not obs.done:
        obs = env.step(obs.expert_plan[0])
    assert obs.won and obs.reward == WIN_REWARD


def test_planner_problem_pruning(valid_seen):
    """The expert plans on a pruned problem: only goal-typed objects and the receptacles that matter."""
    import re

    from roleagent_jax.envs.alfworld.expert import prune_problem

    i = first_of_each_type(valid_seen)[2]  # a clean task
    problem = json.loads(Path(game_files(valid_seen)[i]).read_text())["pddl_problem"]
    pruned = prune_problem(problem)
    goal_types = set(re.findall(r"\(objectType \?\S+ (\S+?)\)", problem[problem.rfind("(:goal") :]))
    kept_types = set(re.findall(r"\(objectType \S+ (\S+?)\)", pruned))
    assert kept_types == goal_types and len(pruned) < len(problem)
    assert "SinkBasinType)" in pruned and pruned.endswith(problem[problem.rfind("(:goal") :])
    assert prune_problem(pruned) is None  # nothing left to remove
