"""The WebShop demo config, shrunk to seconds, through the Trainer: warm start, RL iterations, evaluation."""

import math
from pathlib import Path

import pytest
from conftest import load_config, shrunk


def shrunk_demo(workdir: Path):
    c = shrunk(load_config("webshop_demo"), workdir)
    c.env.webshop.n_products = 50
    c.env.gen.n_train = 4
    c.env.gen.n_eval = 2
    c.env.max_steps = 3
    c.env.num_workers = 1
    c.warmstart.n_games = 4
    c.checkpoint.every = 1
    return c


@pytest.mark.slow  # a whole run end to end (40-140 s on 2 cores): `pytest -m slow`
def test_webshop_demo_trains_through_the_trainer(tmp_path):
    from roleagent_jax.run.trainer import Trainer

    trainer = Trainer(shrunk_demo(tmp_path / "run"))
    try:
        assert trainer.family.name == "webshop" and len(trainer.train_pool) == 4
        assert all(t.expert_plan for t in trainer.train_pool.tasks)
        trainer.warm_start()
        metrics = trainer.iteration(0)
        assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
        result = trainer.evaluate("gen_unseen")
        assert 0.0 <= result["success"] <= 1.0 and result.get("score_name", "score") == "score"
    finally:
        trainer.close()
