"""The search-QA configs validate, and the QA demo, shrunk to seconds, trains through the Trainer."""

import importlib.util
from pathlib import Path

import pytest

from roleagent_jax.config import validate
from roleagent_jax.envs.search_qa.tasks import DATASETS

ROOT = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("name", ["search_qa", "search_qa_demo"])
def test_configs_validate(name):
    c = load(name)
    c.model.path = ""
    validate(c)
    assert c.env.name == "search_qa" and c.env.max_steps == 4


def test_paper_settings():
    c = load("search_qa")
    assert c.env.train_split == "nq:train+hotpotqa:train" and c.env.eval_splits == tuple(DATASETS)
    assert (c.rollout.group_size, c.rollout.tasks_per_iter, c.advantage.invalid_penalty) == (5, 256, 0.01)
    assert c.advantage.anchor_similarity == 0.9


def test_demo_shrunk_to_seconds_trains_and_evaluates(tmp_path):
    """Warm start on expert play, evaluation before/after, one RL iteration, report, Hugging Face export."""
    c = load("search_qa_demo")
    c.workdir = str(tmp_path / "run")
    c.iterations = 1
    c.model.init.hidden_size = 32
    c.model.init.intermediate_size = 64
    c.model.init.num_hidden_layers = 1
    c.model.init.num_attention_heads = 2
    c.model.init.num_key_value_heads = 1
    c.tokenizer.train_vocab_size = 400
    c.env.gen.n_train = 6
    c.env.gen.n_eval = 4
    c.env.search_qa.kb_people = 40
    c.env.search_qa.kb_works = 40
    c.rollout.tasks_per_iter = 2
    c.rollout.group_size = 2
    c.rollout.max_response_tokens = 8
    c.wia.max_tokens = 8
    c.warmstart.steps = 2
    c.warmstart.batch_rows = 4
    c.warmstart.n_games = 6
    c.train.mini_batch_rows = 8
    c.train.micro_batch_rows = 4
    c.log.progress = False
    c.log.tensorboard = False
    from roleagent_jax.trainer import Trainer

    trainer = Trainer(c)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    assert set(summary["eval"]) == {"before", "after"}
    after = summary["eval"]["after"]["gen_test"]
    assert set(after) <= {"single_hop", "bridge", "comparison", "all"} and 0.0 <= after["all"] <= 1.0
    assert Path(summary["report"]).exists()
    final = Path(summary["final_model"])
    assert (final / "model.safetensors").exists()
