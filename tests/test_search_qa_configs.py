"""The search-QA configs validate, and the QA demo, shrunk to seconds, trains through the Trainer."""

from pathlib import Path

import pytest
from conftest import load_config as load
from conftest import shrunk

from roleagent_jax.config import validate
from roleagent_jax.envs.search_qa.tasks import DATASETS


@pytest.mark.parametrize("name", ["search_qa", "search_qa_demo"])
def test_configs_validate(name):
    c = load(name)
    c.model.path = ""
    c.model.required = False
    validate(c)
    assert c.env.name == "search_qa" and c.env.max_steps == 4


def test_paper_settings():
    c = load("search_qa")
    assert c.env.train_split == "nq:train+hotpotqa:train" and c.env.eval_splits == tuple(DATASETS)
    assert (c.rollout.group_size, c.rollout.tasks_per_iter, c.advantage.invalid_penalty) == (5, 256, 0.01)
    assert c.advantage.anchor_similarity == 0.9
    # run_search.sh: greedy validation every 50 iterations, none before training, mini-batch 512
    assert (c.eval.greedy, c.eval.every, c.eval.before, c.train.mini_batch_rows) == (True, 50, False, 512)
    qa = c.env.search_qa
    assert (qa.win_reward, qa.passage_chars, qa.prompt, qa.valid, qa.retriever_request) == (
        1.0,
        0,
        "reference",
        "format",
        "query",
    )


@pytest.mark.slow  # a whole run end to end (40-140 s on 2 cores): `pytest -m slow`
def test_demo_shrunk_to_seconds_trains_and_evaluates(tmp_path):
    """Warm start on expert play, evaluation before/after, one RL iteration, report, Hugging Face export."""
    c = shrunk(load("search_qa_demo"), tmp_path / "run")
    c.env.gen.n_train = 6
    c.env.gen.n_eval = 4
    c.env.search_qa.kb_people = 40
    c.env.search_qa.kb_works = 40
    c.warmstart.n_games = 6
    from roleagent_jax.run.trainer import Trainer

    trainer = Trainer(c)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    assert set(summary["eval"]) == {"before", "after"}
    after = summary["eval"]["after"]["gen_test"]
    assert set(after["per_type"]) <= {"single_hop", "bridge", "comparison"} and 0.0 <= after["success"] <= 1.0
    assert after["score_name"] == "em" and 0.0 <= after["em"] <= 1.0 and after["em_se"] >= 0.0
    assert Path(summary["report"]).exists()
    final = Path(summary["final_model"])
    assert (final / "model.safetensors").exists()


def test_base_config_exposes_the_family_options():
    from roleagent_jax.envs.registry import get_family

    assert load("base").env.search_qa.to_dict() == dict(get_family("search_qa").gen_options)


def test_real_sets_get_the_retriever_from_the_config(tmp_path):
    """The trainer hands env.search_qa to real splits too: the paper config's data sets find their corpus."""
    from roleagent_jax.envs.registry import get_family
    from roleagent_jax.run.setup import make_task_pool

    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "train.jsonl").write_text(
        '{"question": "Capital of Veltia?", "golden_answers": ["Tarsk"]}\n'
    )
    (tmp_path / "corpus.jsonl").write_text(
        '{"id": "0", "contents": "\\"Veltia\\"\\nIts capital is Tarsk."}\n'
    )
    c = load("search_qa")
    c.env.data_dir = str(tmp_path)
    c.env.search_qa.retriever_url = ""
    c.env.search_qa.corpus = str(tmp_path / "corpus.jsonl")
    pool = make_task_pool(c, get_family("search_qa"), "nq:train", tmp_path / "run", "train")
    assert pool.tasks[0].payload.retriever == ("bm25", str((tmp_path / "corpus.jsonl").resolve()))
