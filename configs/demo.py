"""The embedded default: a tiny Qwen2 learns procedurally generated ALFWorld games on a laptop CPU.

    python -m roleagent_jax.main --config=configs/demo.py

A byte-level BPE is trained on game text, a 3-layer Qwen2 is warm-started on expert trajectories (agent
and predictor roles), then Role-Agent RL (GiGPO + WIA + AIW with the heuristic analyser) improves it.
Evaluation runs on held-out generated games (seen and unseen pools) before and after RL.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # config files load by path
from configs import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.algo = "roleagent"
    c.workdir = "runs/demo"
    c.iterations = 12

    c.model.path = ""
    c.model.init.hidden_size = 128
    c.model.init.intermediate_size = 384
    c.model.init.num_hidden_layers = 3
    c.model.init.num_attention_heads = 4
    c.model.init.num_key_value_heads = 2
    c.model.init.max_position_embeddings = 1024
    c.tokenizer.train_vocab_size = 1024

    c.env.train_split = "gen_seen"
    c.env.eval_splits = ("gen_seen", "gen_unseen")
    c.env.max_steps = 15
    c.env.history_k = 1
    c.env.num_workers = 2
    c.env.gen.n_train = 240  # many small rooms: the tiny model must generalise, not memorise
    c.env.gen.n_eval = 24
    c.env.gen.seed = 0
    c.env.gen.num_receptacles = 4
    c.env.gen.num_objects = 2

    c.rollout.tasks_per_iter = 8
    c.rollout.group_size = 4
    c.rollout.max_prompt_tokens = 512
    c.rollout.max_response_tokens = 24

    c.advantage.mode = "mean_norm"
    c.loss.kl_coef = 0.0
    c.loss.kl_type = "none"
    c.optim.lr = 1e-4
    c.train.mini_batch_rows = 128
    c.train.micro_batch_rows = 32

    c.wia.mode = "separate"
    c.wia.horizon = 1
    c.wia.fraction = 0.5
    c.wia.max_tokens = 48

    c.aiw.analyser = "heuristic"
    c.aiw.retrieval = "fuzzy"
    c.aiw.cap = 0.1

    c.warmstart.steps = 500
    c.warmstart.lr = 3e-3
    c.warmstart.explore = 0.25  # off-plan expert steps: teaches recovery from the model's own mistakes
    c.warmstart.batch_rows = 32
    c.warmstart.n_games = 240
    c.warmstart.predictor_fraction = 0.3

    c.eval.every = 0  # before and after RL only
    c.eval.greedy = True
    c.checkpoint.every = 4
    return c
