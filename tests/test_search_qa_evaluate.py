"""`python -m roleagent_jax.evaluate --env=search_qa`: EM per question kind or data set, JSON last."""

import json

import pytest

from roleagent_jax.evaluation.cli import main


def _run(capsys, *argv):
    summary = main(["--env=search_qa", "--num-workers=1", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == summary
    return summary, out


def test_expert_and_random_on_generated_questions(capsys, tmp_path):
    expert, lines = _run(capsys, "--policy=expert", "--split=gen_test", "--gen-n=20", f"--gen-dir={tmp_path}")
    assert expert["n"] == 20 and expert["em"] == 1.0 and expert["invalid_rate"] == 0.0
    assert set(expert["per_type_em"]) == {"single_hop", "bridge", "bridge3", "comparison"}
    assert lines[-3].startswith("all") and "em 100.0%" in lines[-3]
    # the expert searches a second time exactly on the questions whose plan needs one
    behaviour = expert["behaviour"]
    assert behaviour["second_search_needed"] == 1.0 and behaviour["second_search_not_needed"] == 0.0
    assert behaviour["needs_second_search"] + behaviour["needs_no_second_search"] == 20
    assert (
        lines[-2].startswith("behaviour")
        and "second_search_needed 1.000, second_search_not_needed 0.000" in lines[-2]
    )
    rnd, _ = _run(capsys, "--policy=random", "--split=gen_test", "--gen-n=20", "--quiet")
    assert rnd["n"] == 20 and rnd["em"] < 0.1 and rnd["mean_steps"] <= 4
    assert 0.0 <= rnd["behaviour"]["second_search_needed"] <= 1.0


def test_a_real_dataset_file_with_a_local_corpus(capsys, tmp_path):
    data = tmp_path / "hotpot_dev.jsonl"
    data.write_text(
        json.dumps({"question": "Capital of Veltia?", "golden_answers": ["Tarsk"]})
        + "\n"
        + json.dumps({"question": "River of Veltia?", "golden_answers": ["Orrin"]})
        + "\n"
    )
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Veltia"\nVeltia has capital Tarsk.'}) + "\n")
    summary, lines = _run(
        capsys, "--policy=random", "--dataset=hotpotqa", f"--data={data}", f"--corpus={corpus}"
    )
    assert summary["n"] == 2 and summary["split"] == "hotpotqa"
    assert list(summary["per_type_em"]) == ["hotpotqa"] and 0.0 <= summary["em"] <= 1.0
    assert lines[-3].startswith("hotpotqa")
    assert "behaviour" not in summary  # a real data set's questions have no expert plan
    assert not any(line.startswith("behaviour") for line in lines)


def test_episodes_file_holds_each_episode_as_played(capsys, tmp_path):
    path = tmp_path / "episodes.jsonl"
    summary, _ = _run(
        capsys,
        "--policy=expert",
        "--split=gen_test",
        "--gen-n=12",
        f"--gen-dir={tmp_path}",
        f"--episodes={path}",
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["task_id"] for r in records] == list(range(12))
    assert [int(r["won"]) for r in records] == summary["wins"]
    assert sum(len(r["steps"]) for r in records) / 12 == summary["mean_steps"]
    for r in records:
        *searches, answer = r["steps"]
        # the expert searches until the passages hold the answer, then answers; the answer ends it
        assert searches and r["won"]
        assert all(s["action"].startswith("<search>") and s["result"] for s in searches)
        assert answer["action"].startswith("<answer>") and answer["reward"] > 0
    assert not (tmp_path / "episodes.jsonl.tmp").exists()


def test_episodes_file_in_a_missing_folder_is_refused_before_playing(capsys, tmp_path):
    bad = tmp_path / "nowhere" / "episodes.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(["--env=search_qa", "--policy=expert", "--split=gen_test", f"--episodes={bad}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --episodes={bad}: folder {str(bad.parent)!r} does not exist"]
