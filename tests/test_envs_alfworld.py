"""The ALFWorld backend on the real games of ../shared/data/alfworld (skipped when they are absent)."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from textworld_reference import transcript

from roleagent_jax.envs import TASK_TYPES, AlfWorldEnv, TaskPool
from roleagent_jax.envs.alfworld import WIN_REWARD, split_dir, task_type_of
from roleagent_jax.evaluate import ExpertPolicy, RandomPolicy, evaluate

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
    return TaskPool.from_split(alfworld_data, "valid_seen")


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
        hits = [i for i, f in enumerate(pool.game_files) if f"/{folder}/" in f]
        out.append(hits[0] if hits else pool.task_types.index(task_type))
    return out


def test_valid_seen_counts_and_order(valid_seen):
    assert len(valid_seen) == 140
    assert Counter(valid_seen.task_types) == EXPECTED_COUNTS
    assert valid_seen.game_files == sorted(valid_seen.game_files)
    for f, t, g in zip(valid_seen.game_files, valid_seen.task_types, valid_seen.goals):
        assert f.endswith("game.tw-pddl") and t == task_type_of(f) and g.endswith(".")


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        TaskPool.from_split(tmp_path / "nowhere", "valid_seen")
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        split_dir(None, "valid_seen")


def test_expert_wins_one_game_per_type(valid_seen):
    env = AlfWorldEnv(max_steps=50, expert_plan=True)
    for i in first_of_each_type(valid_seen):
        obs, info = env.reset(valid_seen.game_files[i])
        assert info["goal"] == valid_seen.goals[i] and info["task_type"] == valid_seen.task_types[i]
        assert info["anchor"] == obs and not info["won"] and not info["env_failed"]
        total, done = 0.0, False
        while not done:
            assert info["expert_plan"][0] in info["admissible_commands"]
            obs, reward, done, info = env.step(info["expert_plan"][0])
            total += reward
        assert info["won"] and total == WIN_REWARD, valid_seen.game_files[i]
        assert info["step"] <= 20


def test_reset_loads_exactly_the_requested_game(valid_seen):
    env = AlfWorldEnv(max_steps=5)
    a, b = first_of_each_type(valid_seen)[:2]
    obs_a, info_a = env.reset(valid_seen.game_files[a])
    env.step(info_a["admissible_commands"][0])
    obs_b, info_b = env.reset(valid_seen.game_files[b])
    assert info_b["goal"] == valid_seen.goals[b] != valid_seen.goals[a]
    again, info_again = env.reset(valid_seen.game_files[a])  # back to the first game's initial state
    assert again == obs_a and info_again["admissible_commands"] == info_a["admissible_commands"]


def test_cached_engine_matches_plain_textworld(valid_seen):
    """Cached resets and memoized parsers must play exactly like textworld's own uncached PddlEnv under
    alfworld's wrappers, run in a process of its own (ours changes textworld in this one)."""
    game = valid_seen.game_files[first_of_each_type(valid_seen)[0]]
    ref = transcript(game, 7, 3, 8)
    ours = AlfWorldEnv(max_steps=50)
    for _ in range(2):  # second round uses the cached translation
        obs, info = ours.reset(game)
        assert [obs, info["admissible_commands"]] == ref[0]
        for k in range(8):
            cmds = info["admissible_commands"]
            obs, _, _, info = ours.step(cmds[(7 * k + 3) % len(cmds)])
            assert [obs, info["admissible_commands"]] == ref[k + 1]


def test_episode_ends_at_max_steps_and_stays_done(valid_seen):
    env = AlfWorldEnv(max_steps=3)
    obs, info = env.reset(valid_seen.game_files[0])
    dones = [env.step("look")[2] for _ in range(3)]
    assert dones == [False, False, True]
    obs2, reward, done, info2 = env.step("look")
    assert done and reward == 0.0 and info2["step"] == 3


def test_random_fails_where_expert_wins(valid_seen):
    """A few fixed games of the harder types: the expert wins all, the random policy none."""
    ids = first_of_each_type(valid_seen)
    sub = valid_seen.subset([ids[2], ids[5]])  # clean, pick two
    expert = evaluate(ExpertPolicy(), sub, "valid_seen", num_workers=1, max_steps=50)
    random_ = evaluate(RandomPolicy(0), sub, "valid_seen", num_workers=1, max_steps=25)
    assert expert["success"] == 1.0 and expert["n"] == 2
    assert random_["success"] == 0.0 and random_["invalid_rate"] == 0.0


@pytest.mark.slow
def test_expert_and_random_on_all_of_valid_seen(valid_seen):
    expert = evaluate(ExpertPolicy(), valid_seen, "valid_seen", num_workers=2, max_steps=50)
    assert expert["n"] == 140 and expert["success"] >= 0.95, json.dumps(expert)
    random_ = evaluate(RandomPolicy(0), valid_seen, "valid_seen", num_workers=2, max_steps=50)
    assert random_["n"] == 140 and random_["success"] < 0.10, json.dumps(random_)


def test_data_2_1_3_verbs(valid_seen, tmp_path):
    """The same real game written with the packaged (2.1.3) domain and grammar: 'move X to Y' and 'help'
    replace 'put X in/on Y', and the backend and expert follow without knowing the verb."""
    from roleagent_jax.envs import procgen

    src = Path(valid_seen.game_files[first_of_each_type(valid_seen)[0]])
    game = json.loads(src.read_text())
    goal = valid_seen.goals[first_of_each_type(valid_seen)[0]].rstrip(".")
    game["grammar"] = procgen.GRAMMAR_FILE.read_text().replace("UNKNOWN GOAL", goal)
    game["pddl_domain"] = procgen.DOMAIN_FILE.read_text()
    dst = tmp_path / "json_2.1.1" / "valid_seen" / src.parent.parent.name / src.parent.name
    dst.mkdir(parents=True)
    (dst / "game.tw-pddl").write_text(json.dumps(game))
    shutil.copy(src.parent / "traj_data.json", dst / "traj_data.json")
    pool = TaskPool.from_split(tmp_path, "valid_seen")
    assert pool.goals == [goal + "."]
    env = AlfWorldEnv(expert_plan=True)
    obs, info = env.reset(pool.game_files[0])
    assert "help" in info["admissible_commands"]
    assert any(c.startswith("move ") for c in info["expert_plan"])
    assert not any(c.startswith("put ") for c in info["expert_plan"])
    done = False
    while not done:
        obs, reward, done, info = env.step(info["expert_plan"][0])
    assert info["won"] and reward == WIN_REWARD


def test_planner_problem_pruning(valid_seen):
    """The expert plans on a pruned problem: only goal-typed objects and the receptacles that matter."""
    import re

    from roleagent_jax.envs.alfworld import prune_problem

    i = first_of_each_type(valid_seen)[2]  # a clean task
    problem = json.loads(Path(valid_seen.game_files[i]).read_text())["pddl_problem"]
    pruned = prune_problem(problem)
    goal_types = set(re.findall(r"\(objectType \?\S+ (\S+?)\)", problem[problem.rfind("(:goal") :]))
    kept_types = set(re.findall(r"\(objectType \S+ (\S+?)\)", pruned))
    assert kept_types == goal_types and len(pruned) < len(problem)
    assert "SinkBasinType)" in pruned and pruned.endswith(problem[problem.rfind("(:goal") :])
    assert prune_problem(pruned) is None  # nothing left to remove
