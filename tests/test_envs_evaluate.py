"""The evaluation command: fixed panel, result independent of workers and batching, JSON last line."""

import json

import pytest

from roleagent_jax.envs import EnvPool, get_family
from roleagent_jax.evaluation import cli, panel
from roleagent_jax.types import Step, Trajectory

ALFWORLD = get_family("alfworld")


@pytest.fixture(scope="module")
def gen_root(tmp_path_factory):
    return tmp_path_factory.mktemp("eval_games")


def test_panel_does_not_depend_on_workers_or_batching(gen_root):
    pool = ALFWORLD.task_pool("gen_seen", gen_dir=gen_root, n=6, seed=1)
    policy = panel.RandomPolicy(ALFWORLD, seed=3)
    with EnvPool(ALFWORLD, pool, num_workers=1, step_timeout=60) as envs:
        a = panel.run_episodes(policy, ALFWORLD, envs, list(range(6)), max_steps=6)
    with EnvPool(ALFWORLD, pool, num_workers=2, step_timeout=60) as envs:
        b = panel.run_episodes(policy, ALFWORLD, envs, [0, 1, 2, 3], max_steps=6) + panel.run_episodes(
            policy, ALFWORLD, envs, [4, 5], 6
        )

    def played(trajs):  # what happened, not where in the batch it was played
        return [(t.task_id, t.task_type, t.won, t.steps, t.env_failed) for t in trajs]

    assert played(a) == played(b)
    assert [r.task_id for r in a] == list(range(6))


def test_cli_prints_json_last(gen_root, capsys):
    summary = cli.main(
        ["--policy=expert", "--split=gen_unseen", f"--gen-dir={gen_root}", "--gen-n=6", "--num-workers=1"]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == summary
    assert summary["split"] == "gen_unseen" and summary["n"] == 6 and summary["success"] == 1.0
    assert len(summary["per_type"]) == 6 and summary["invalid_rate"] == 0.0


def test_cli_errors_are_clear(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(SystemExit):
        cli.main(["--split=valid_seen", f"--data={tmp_path}"])
    assert "alfworld-download" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--split=gen_seen", f"--gen-dir={tmp_path}", "--checkpoint=/nonexistent"])
    with pytest.raises(SystemExit):
        cli.main(["--env=nope", "--split=gen_seen"])
    assert "unknown environment 'nope'; known: alfworld" in capsys.readouterr().err


def episode(task_id: int, task_type: str, won: bool, steps: int, invalid: int) -> Trajectory:
    moves = [Step("o", ["a"], "", None if k < invalid else "a", k >= invalid, 0.0, "o") for k in range(steps)]
    return Trajectory(task_id, task_type, "goal", moves, won=won)


def test_summary_per_type():
    rs = [
        episode(0, "pick_two_obj_and_place", True, 5, 0),
        episode(1, "pick_two_obj_and_place", False, 50, 2),
        episode(2, "look_at_obj_in_light", True, 4, 0),
    ]
    s = panel.summarize("x", rs, ALFWORLD.task_types)
    assert s["n"] == 3 and s["success"] == pytest.approx(2 / 3)
    assert list(s["per_type"]) == ["look_at_obj_in_light", "pick_two_obj_and_place"]
    assert s["per_type"]["pick_two_obj_and_place"] == 0.5 and s["invalid_rate"] == pytest.approx(2 / 59)


def test_seed_reaches_the_model_policy(monkeypatch):
    """--seed picks the model's sampling key too, so a panel can be replayed under other draws; --greedy
    reaches it as well."""
    import roleagent_jax.evaluation.policy as policy

    seen = {}

    def record(checkpoint, family, temperature=0.4, seed=0, greedy=False):
        seen.update(checkpoint=checkpoint, temperature=temperature, seed=seed, greedy=greedy)

    monkeypatch.setattr(policy, "ModelPolicy", record)
    panel.make_policy("expert", 7, "ckpt", 0.7, ALFWORLD, greedy=True)
    assert seen == {"checkpoint": "ckpt", "temperature": 0.7, "seed": 7, "greedy": True}


def test_a_scored_summary_carries_its_score_and_standard_error_into_the_metrics():
    """A family that scores episodes gets its mean score, the score's standard error and its name in the
    one summary; the trainer logs the same numbers as eval/<split>/<name>."""
    import math
    import statistics

    from roleagent_jax.run.metrics import eval_metrics

    def traj(task_type, won, score):
        return Trajectory(task_id=0, task_type=task_type, goal="g", won=won, score=score)

    trajs = [traj("a", True, 1.0), traj("a", False, 0.5), traj("b", False, None), traj("b", False, 0.25)]
    s = panel.summarize("test", trajs, ["a", "b"], score_name="em")
    every = [1.0, 0.5, 0.0, 0.25]  # an episode without a score counts 0
    assert s["score_name"] == "em" and s["em"] == sum(every) / 4
    assert math.isclose(s["em_se"], statistics.stdev(every) / 2)
    assert s["per_type_em"] == {"a": 0.75, "b": 0.125} and s["success"] == 0.25
    assert eval_metrics("test", s) == {"eval/test/a": 0.5, "eval/test/b": 0.0, "eval/test/all": 0.25,
                                       "eval/test/games": 4.0, "eval/test/em": s["em"]}  # fmt: skip
    assert s["wins"] == [1, 0, 0, 0]  # each game's outcome, for paired comparisons
    unscored = panel.summarize("test", [traj("a", True, None)], ["a"])
    assert "score_name" not in unscored and set(eval_metrics("test", unscored)) == {
        "eval/test/a",
        "eval/test/all",
        "eval/test/games",
    }


class Counting(type(ALFWORLD)):
    """ALFWorld with its own behaviour rate: the share of episodes that took more than two steps."""

    def behaviour(self, trajs, pool):
        return {"long": sum(len(t.steps) > 2 for t in trajs) / len(trajs)} if trajs else {}


def test_the_summary_carries_the_family_behaviour_rates_only_where_it_reports_some():
    """`behaviour` holds the family's rates of what the episodes did; a family without the hook (the
    default gives {}) leaves the summary as it was, and so does a summary made without family or pool."""
    from roleagent_jax.envs.base import Task, TaskPool

    pool = TaskPool([Task(f"t{i}", "look_at_obj_in_light", "goal") for i in range(2)])
    rs = [episode(0, "look_at_obj_in_light", True, 5, 0), episode(1, "look_at_obj_in_light", False, 1, 0)]
    plain = panel.summarize("x", rs, ALFWORLD.task_types, pool=pool)
    assert ALFWORLD.behaviour(rs, pool) == {}
    assert panel.summarize("x", rs, ALFWORLD.task_types, pool=pool, family=ALFWORLD) == plain
    assert "behaviour" not in plain
    rated = panel.summarize("x", rs, ALFWORLD.task_types, pool=pool, family=Counting())
    assert rated == {**plain, "behaviour": {"long": 0.5}}
    assert "behaviour" not in panel.summarize("x", rs, ALFWORLD.task_types, family=Counting())  # no pool
    assert (
        panel.behaviour_text({"rate": 0.25, "count": 12, "all": 1.0, "third": 1 / 3})
        == "rate 0.250, count 12, all 1.000, third 0.333"
    )
