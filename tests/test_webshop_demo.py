"""The WebShop demo config, shrunk to seconds, through the Trainer: warm start, RL iterations, evaluation."""

import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shrunk_demo(workdir: Path):
    spec = importlib.util.spec_from_file_location("webshop_demo", ROOT / "configs" / "webshop_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.workdir = str(workdir)
    c.iterations = 1
    c.model.init.hidden_size = 32
    c.model.init.intermediate_size = 64
    c.model.init.num_hidden_layers = 1
    c.model.init.num_attention_heads = 2
    c.model.init.num_key_value_heads = 1
    c.tokenizer.train_vocab_size = 400
    c.env.webshop.n_products = 50
    c.env.gen.n_train = 4
    c.env.gen.n_eval = 2
    c.env.max_steps = 3
    c.env.num_workers = 1
    c.rollout.tasks_per_iter = 2
    c.rollout.group_size = 2
    c.rollout.max_response_tokens = 8
    c.wia.max_tokens = 8
    c.warmstart.steps = 2
    c.warmstart.batch_rows = 4
    c.warmstart.n_games = 4
    c.train.mini_batch_rows = 8
    c.train.micro_batch_rows = 4
    c.checkpoint.every = 1
    c.log.progress = False
    c.log.tensorboard = False
    return c


def test_webshop_demo_trains_through_the_trainer(tmp_path):
    from roleagent_jax.trainer import Trainer

    trainer = Trainer(shrunk_demo(tmp_path / "run"))
    try:
        assert trainer.family.name == "webshop" and len(trainer.train_pool) == 4
        assert all(t.expert_plan for t in trainer.train_pool.tasks)
        trainer.warm_start()
        metrics = trainer.iteration(0)
        assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
        result = trainer.evaluate("gen_unseen")
        assert 0.0 <= result["all"] <= 1.0
    finally:
        trainer.close()
