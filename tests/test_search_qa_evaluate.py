"""`python -m roleagent_jax.evaluate --env=search_qa`: EM per question kind or data set, JSON last."""

import json

from roleagent_jax.evaluate import main


def _run(capsys, *argv):
    summary = main(["--env=search_qa", "--num-workers=1", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == summary
    return summary, out


def test_expert_and_random_on_generated_questions(capsys, tmp_path):
    expert, lines = _run(capsys, "--policy=expert", "--split=gen_test", "--gen-n=20", f"--gen-dir={tmp_path}")
    assert expert["n"] == 20 and expert["em"] == 1.0 and expert["invalid_rate"] == 0.0
    assert set(expert["per_type_em"]) == {"single_hop", "bridge", "bridge3", "comparison"}
    assert lines[-2].startswith("all") and "em 100.0%" in lines[-2]
    rnd, _ = _run(capsys, "--policy=random", "--split=gen_test", "--gen-n=20", "--quiet")
    assert rnd["n"] == 20 and rnd["em"] < 0.1 and rnd["mean_steps"] <= 4


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
