"""The paper's ALFWorld run (reference §5): Qwen2.5-1.5B-Instruct, 16 tasks x 8 rollouts, 150 iterations.

python -m roleagent_jax.main --config=configs/alfworld.py --config.model.path=/path/Qwen2.5-1.5B-Instruct
"""

import os

from configs import base


def get_config():
    c = base.get_config()
    c.workdir = "runs/alfworld"
    c.iterations = 150
    base.paper_run(c)
    c.env.data_dir = os.environ.get("ALFWORLD_DATA", "")
    c.env.data_required = True
    c.env.train_split = "train"
    c.env.eval_splits = ("valid_seen", "valid_unseen")
    c.env.max_steps = 50
    c.env.history_k = 2
    c.env.num_workers = 32
    c.rollout.tasks_per_iter = 16
    c.rollout.group_size = 8
    c.rollout.max_prompt_tokens = 2048
    c.rollout.max_rows_per_call = 0
    c.advantage.invalid_penalty = 0.1
    c.loss.clip_eps = 0.2
    c.loss.dual_clip = 3.0
    c.loss.kl_coef = 0.01
    c.loss.entropy_coef = 0.001
    c.loss.agg = "token-mean"
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.train.mini_batch_rows = 256
    c.wia.horizon = 2
    c.wia.lam = 1.0
    c.aiw.retrieval = "llm"  # the policy chooses among the candidates the memory proposes
    c.eval.every = 5
    c.eval.temperature = 0.4
    return c
