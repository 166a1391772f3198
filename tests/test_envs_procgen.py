"""Procedurally generated games: valid for alfworld's domain, solvable, reproducible, split by pool."""

import json
import re
from collections import Counter
from pathlib import Path

import alfworld.gen.constants as C
import pytest

from roleagent_jax.envs import TaskPool
from roleagent_jax.envs.alfworld import procgen
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv
from roleagent_jax.envs.alfworld.games import TASK_TYPES, WIN_REWARD
from roleagent_jax.envs.alfworld.procgen import generated_pool


def game_files(pool: TaskPool) -> list[str]:
    return [t.payload for t in pool.tasks]


def play_expert(
    pool: TaskPool, max_steps: int = 50, expert_type: str = "planner"
) -> list[tuple[bool, int, list[str]]]:
    """Play every game with alfworld's expert on the engine: (won, steps, observations) per game."""
    env = AlfWorldEnv(max_steps=max_steps, expert_type=expert_type)
    out = []
    for task in pool.tasks:
        obs = env.reset(task, expert=True)
        seen, total = [obs.text], 0.0
        while not obs.done:
            obs = env.step(obs.expert_plan[0] if obs.expert_plan else "look")
            seen.append(obs.text)
            total += obs.reward
        assert total == (WIN_REWARD if obs.won else 0.0)
        out.append((obs.won, obs.info["step"], seen))
    return out


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("games")


@pytest.fixture(scope="module")
def seen12(gen_dir) -> TaskPool:
    return generated_pool(gen_dir, n=12, seed=3, pool="seen")


def test_two_games_per_type_all_won_by_the_expert(seen12):
    assert Counter(seen12.task_types) == {t: 2 for t in TASK_TYPES}
    results = play_expert(seen12)
    assert all(won for won, _, _ in results)
    steps = [n for _, n, _ in results]
    assert 3 <= min(steps) and max(steps) <= 12, steps
    # the plans recorded at generation time replay to a win as well
    assert set(seen12.expert_plans) == set(range(len(seen12)))
    assert [len(seen12.expert_plans[i]) for i in range(len(seen12))] == steps


def test_text_is_alfworlds(seen12):
    env = AlfWorldEnv(max_steps=50)
    for i, game in enumerate(game_files(seen12)):
        obs = env.reset(game)
        assert obs.text.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert "You are in the middle of a room. Looking quickly around you, you see" in obs.text
        assert f"Your task is to: {seen12.goals[i]}" in obs.text
        go = [c for c in obs.admissible if c.startswith("go to ")]
        assert go, obs.admissible
        assert env.step(go[0]).text.startswith("You arrive at ")


def test_handcoded_expert_also_solves_most(seen12):
    """alfworld's rule-based expert (it explores instead of planning) wins the single-object tasks."""
    single = seen12.subset([i for i, t in enumerate(seen12.task_types) if t != "pick_two_obj_and_place"])
    results = play_expert(single, expert_type="handcoded")
    assert sum(won for won, _, _ in results) >= len(results) - 1


def test_same_seed_same_files_and_other_seed_differs(tmp_path):
    a = procgen.generate(tmp_path / "a", 3, seed=11, pool="seen")
    b = procgen.generate(tmp_path / "b", 3, seed=11, pool="seen")
    c = procgen.generate(tmp_path / "c", 3, seed=12, pool="seen")
    files = lambda s: {str(Path(f).relative_to(s.folder)): Path(f).read_bytes() for f in s.game_files}  # noqa: E731
    assert files(a) == files(b)
    assert (a.folder / "manifest.json").read_bytes() == (b.folder / "manifest.json").read_bytes()
    assert files(a) != files(c)
    again = procgen.generate(tmp_path / "a", 3, seed=11, pool="seen")  # reused, not regenerated
    assert again.game_files == a.game_files
    with pytest.raises(ValueError, match="other settings"):
        procgen.generate(tmp_path / "a", 4, seed=11, pool="seen")


def test_a_kill_while_the_manifest_is_written_leaves_a_set_made_again(tmp_path, monkeypatch):
    """The manifest is what marks a set as made: a kill halfway through writing it must not leave a
    half file that the next run reads (it would fail on every restart), only games to make again."""

    class Killed(Exception):
        pass

    write_text = Path.write_text

    def cut_short(self, text, *args, **kwargs):
        if self.name.startswith("manifest.json"):
            write_text(self, text[: len(text) // 2], *args, **kwargs)
            raise Killed
        return write_text(self, text, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", cut_short)
        with pytest.raises(Killed):
            procgen.generate(tmp_path / "killed", 2, seed=11, pool="seen")
    again = procgen.generate(tmp_path / "killed", 2, seed=11, pool="seen")
    clean = procgen.generate(tmp_path / "clean", 2, seed=11, pool="seen")
    files = lambda s: [Path(f).read_bytes() for f in s.game_files]  # noqa: E731
    assert files(again) == files(clean)
    assert (again.folder / "manifest.json").read_bytes() == (clean.folder / "manifest.json").read_bytes()


def test_parallel_generation_writes_the_same_files_as_serial(tmp_path, monkeypatch):
    """Games made in worker processes are byte-identical to those made one by one (manifest included)."""
    serial = procgen.generate(tmp_path / "serial", 8, seed=5, pool="unseen", workers=1)

    def no_checking_here(max_expert_steps):
        raise AssertionError("games must be checked in the worker processes, not in this one")

    with monkeypatch.context() as m:  # the workers import procgen afresh, so they check games as usual
        m.setattr(procgen, "_checker", no_checking_here)
        parallel = procgen.generate(tmp_path / "parallel", 8, seed=5, pool="unseen", workers=2)

    def tree(made: procgen.GeneratedSet) -> dict[str, bytes]:
        return {
            str(f.relative_to(made.folder)): f.read_bytes() for f in made.folder.rglob("*") if f.is_file()
        }

    assert len(tree(serial)) == 2 * 8 + 1  # game + traj_data per game, one manifest
    assert tree(parallel) == tree(serial)
    with pytest.raises(RuntimeError, match="could not generate a solvable"):  # a worker's error reaches us
        procgen.generate(tmp_path / "none", 8, seed=5, pool="seen", max_attempts=0, workers=2)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        procgen.generate(tmp_path / "none", 8, seed=5, pool="seen", workers=0)


def combos_of(pool: TaskPool) -> set[tuple]:
    out = set()
    for f in game_files(pool):
        traj = json.loads((Path(f).parent / "traj_data.json").read_text())
        p = traj["pddl_params"]
        out.add(
            (traj["task_type"], traj["room"], p["object_target"], p["parent_target"] or p["toggle_target"])
        )
    return out


def test_seen_and_unseen_are_disjoint(gen_dir, seen12):
    for t in TASK_TYPES:
        seen, unseen = set(procgen.pool_combinations(t, "seen")), set(procgen.pool_combinations(t, "unseen"))
        assert seen and unseen and not seen & unseen
        assert seen | unseen == set(procgen.task_combinations(t))
    unseen6 = generated_pool(gen_dir, n=6, seed=3, pool="unseen")
    assert Counter(unseen6.task_types) == {t: 1 for t in TASK_TYPES}
    a, b = combos_of(seen12), combos_of(unseen6)
    assert not a & b
    assert all(c in set(procgen.pool_combinations(c[0], "unseen")) for c in b)
    assert all(won for won, _, _ in play_expert(unseen6))


def test_world_tables_agree_with_alfworld():
    """Every containment and affordance the generator writes is one alfworld's own tables allow."""
    for room, table in procgen.ROOMS.items():
        for recep, objs in table.items():
            assert recep in C.RECEPTACLES, recep
            allowed = C.VAL_RECEPTACLE_OBJECTS[recep]
            assert set(objs) <= allowed, (room, recep, set(objs) - allowed)
    acts = C.VAL_ACTION_OBJECTS
    assert procgen.HEATABLE <= acts["Heatable"] and procgen.COOLABLE <= acts["Coolable"]
    assert procgen.CLEANABLE <= acts["Cleanable"] and procgen.LAMP in acts["Toggleable"]
    assert procgen.OPENABLE <= set(C.OPENABLE_CLASS_LIST)
    for task, rooms in procgen.TASK_ROOMS.items():
        allowed_rooms = {r.lower() for r in C.GOALS_VALID[task]}
        assert set(rooms) <= allowed_rooms, task


def test_problem_has_the_structure_of_real_games(seen12):
    real_predicates = {
        "atLocation", "receptacleType", "objectType", "canContain", "pickupable", "openable", "inReceptacle",
        "receptacleAtLocation", "objectAtLocation", "isReceptacleObject", "cleanable", "heatable", "coolable",
        "toggleable",
    }  # fmt: skip
    for f in game_files(seen12):
        game = json.loads(Path(f).read_text())
        assert set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable"} and game["solvable"]
        assert game["pddl_domain"] == procgen.DOMAIN_FILE.read_text()
        problem = game["pddl_problem"]
        init = problem[problem.index("(:init") : problem.index("(:goal")]
        assert set(re.findall(r"\((\w+) ", init)) <= real_predicates
        for kind in ("agent", "object", "otype", "rtype", "receptacle", "location"):
            assert f" - {kind}\n" in problem
        assert "_bar_" in problem and "(:domain alfred)" in problem


def test_size_settings(tmp_path):
    pool = generated_pool(
        tmp_path, n=6, seed=5, pool="seen", num_receptacles=4, num_objects=0, extra_targets=0
    )
    for f in game_files(pool):
        problem = json.loads(Path(f).read_text())["pddl_problem"]
        objects = problem[problem.index("(:objects") : problem.index("(:init")]
        assert objects.count(" - receptacle\n") == 4
        n_objects = objects.count(" - object\n")
        assert n_objects <= 3  # goal object(s) and the lamp only
    with pytest.raises(ValueError):
        procgen.GenSize(num_receptacles=(6, 4)).ranges()
    with pytest.raises(ValueError):
        generated_pool(tmp_path, n=2, seed=0, pool="other")


@pytest.mark.slow
def test_two_hundred_games_all_won(tmp_path):
    pool = generated_pool(tmp_path, n=200, seed=0, pool="seen")
    assert Counter(pool.task_types) == {t: 200 // 6 + (i < 200 % 6) for i, t in enumerate(TASK_TYPES)}
    results = play_expert(pool)
    assert all(won for won, _, _ in results)
    unseen = generated_pool(tmp_path, n=60, seed=0, pool="unseen")
    assert all(won for won, _, _ in play_expert(unseen))
    assert not combos_of(pool) & combos_of(unseen)


def test_expert_replans_after_a_detour(seen12):
    """Leaving the plan (a wrong first move) makes the expert replan from the current state; it still wins."""
    env = AlfWorldEnv(max_steps=30)
    for game in game_files(seen12)[::2]:
        obs = env.reset(game, expert=True)
        plan = obs.expert_plan
        detour = next(c for c in obs.admissible if c.startswith("go to ") and c != plan[0])
        obs = env.step(detour)
        assert obs.expert_plan and obs.expert_plan != plan[1:]
        while not obs.done:
            obs = env.step(obs.expert_plan[0])
        assert obs.won, game


def test_games_share_one_parsed_grammar_yet_play_like_plain_textworld(seen12):
    """Only the task sentence differs between games' grammars: the cached logic is parsed once and given
    each game's sentence. Every rule must equal a whole parse, and play must match plain textworld in a
    process of its own (with textworld's parsers memoized in this one, as in a worker)."""
    from textworld.envs.pddl.logic import GameLogic
    from textworld_reference import transcript

    from roleagent_jax.envs.alfworld.engine import _logic_for, memoize_textworld_parsers

    memoize_textworld_parsers(True)  # as in an env worker
    games = game_files(seen12)[:4]  # four task types, four sentences
    for game in games:
        data = json.loads(Path(game).read_text())
        ours = _logic_for(data["pddl_domain"], data["grammar"])
        whole = GameLogic(data["pddl_domain"], data["grammar"])
        assert {k: repr(v) for k, v in ours.grammar._rules.items()} == {
            k: repr(v) for k, v in whole.grammar._rules.items()
        }
        assert sorted(ours.actions) == sorted(whole.actions)
    env = AlfWorldEnv(max_steps=50)
    refs = {game: transcript(game, 5, 2, 6) for game in games}
    for game in games + games[:1]:  # back to the first: its logic comes from the cache
        ref = refs[game]
        obs = env.reset(game)
        assert [obs.text, obs.admissible] == ref[0]
        assert "Your task is to: " + obs.info["goal"] in obs.text
        for k in range(6):
            cmds = obs.admissible
            obs = env.step(cmds[(5 * k + 2) % len(cmds)])
            assert [obs.text, obs.admissible] == ref[k + 1]


def test_memoized_parsers_hand_out_fresh_symbols_and_can_be_undone():
    """Derivation sets each symbol's context: a cached parse must come back as new, equal objects."""
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    from roleagent_jax.envs.alfworld.engine import memoize_textworld_parsers

    memoize_textworld_parsers(True)  # what an ALFWorld worker does when it starts
    text = "You arrive at {r.name}. #examineReceptacle.feedback# [{o.name | inreceptacle(o, r)}]"
    query = "inreceptacle(o, r)"
    first = textgen._parse_and_convert(text, rule_name="symbols")
    second = textgen._parse_and_convert(text, rule_name="symbols")
    assert repr(first) == repr(second) and len(first) >= 4
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert Rule.parse_conjunctive_query(query) is Rule.parse_conjunctive_query(query)
    memoize_textworld_parsers(False)
    try:
        plain = textgen._parse_and_convert(text, rule_name="symbols")
        assert repr(plain) == repr(first)
        assert Rule.parse_conjunctive_query(query) is not Rule.parse_conjunctive_query(query)
        assert str(Rule.parse_conjunctive_query(query)) == str(Rule.parse_conjunctive_query(query))
    finally:
        memoize_textworld_parsers(True)
    assert Rule.parse_conjunctive_query(query) is Rule.parse_conjunctive_query(query)


def test_parser_memo_is_applied_by_the_worker_start_not_by_an_import():
    """Importing the engine leaves textworld as it is; the family's worker start-up turns the memo on."""
    import subprocess
    import sys

    code = (
        "from textworld.envs.pddl import textgen\n"
        "plain = textgen._parse_and_convert\n"
        "import roleagent_jax.envs.alfworld.engine\n"
        "from roleagent_jax.envs import get_family\n"
        "assert textgen._parse_and_convert is plain, 'memoized at import'\n"
        "get_family('alfworld').start_worker()\n"
        "assert textgen._parse_and_convert is not plain, 'not memoized by start_worker'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_entities_are_the_games_own_including_unseen_ones(tmp_path):
    """The ground truth of what a game holds: every entity its text ever shows, and more than the first
    observation shows (objects inside closed receptacles, on places not visited yet)."""
    pool = generated_pool(tmp_path, n=6, seed=3)
    env = AlfWorldEnv(max_steps=50)
    for task in pool.tasks:
        obs = env.reset(task)
        truth = env.entities()
        shown = set(re.findall(r"[a-z]+ \d+", obs.text))
        for cmd in task.expert_plan:
            obs = env.step(cmd)
            shown |= set(re.findall(r"[a-z]+ \d+", obs.text + " " + cmd))
        assert obs.won
        assert shown <= truth, shown - truth
        first = set(re.findall(r"[a-z]+ \d+", env.reset(task).text))
        assert first < truth
        assert not any(name.startswith(("loc ", "agent")) for name in truth)


def test_state_identity_keeps_what_changes_nothing_and_tells_inventories_apart(seen12):
    """The engine's state (GiGPO's step-group key under advantage.anchor=state): an invalid command and
    `look` leave it as it was, "Nothing happens." from two states stays two states, and the same room
    text before and after taking an object is two states."""
    env = AlfWorldEnv(max_steps=30)
    task = next(t for t in seen12.tasks if t.type == "pick_and_place_simple")
    start = env.reset(task, expert=True)
    plan = list(start.expert_plan)  # go to X, take obj from X, go to Y, put obj in/on Y
    junk = env.step("jump over the moon")
    assert junk.text == "Nothing happens." and junk.state == start.state
    at_source = env.step(plan[0])
    assert env.step("look").state == at_source.state != start.state
    nothing_there = env.step("jump over the moon")
    assert nothing_there.text == junk.text and nothing_there.state != junk.state
    assert env.step(plan[1]).state != at_source.state
    holding = env.step(plan[2])  # at the target, object in hand
    env.reset(task)
    empty_handed = env.step(plan[2])  # the same target straight from the start
    assert holding.text == empty_handed.text and holding.state != empty_handed.state
