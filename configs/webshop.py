"""The paper's WebShop run: Qwen2.5-1.5B-Instruct, 16 goals x 8 rollouts, 15 steps, mean_norm, WIA horizon 1.

python -m roleagent_jax.main --config=configs/webshop.py --config.model.path=/path/Qwen2.5-1.5B-Instruct

WebShop's files (items_shuffle_1000.json, items_ins_v2_1000.json, items_human_ins.json) come from its
setup.sh; point $WEBSHOP_DATA (or --config.env.data_dir) at them. The family's default protocol is the
reference runs' ("paper": synthetic goals, training on goals 500 onwards, evaluation on a fixed 256 of
the first 500); --config.env.webshop.protocol=webshop plays WebShop's own (human goals, the first 500).
Settings follow Role-Agent's run_webshop_gigpo.sh: mini-batch 64, evaluation before training and every 5
iterations at temperature 0.4, invalid-action penalty 0.1.
"""

import os

from configs import alfworld


def get_config():
    c = alfworld.get_config()  # the same model, optimiser, loss and sampling settings
    c.workdir = "runs/webshop"
    c.env.name = "webshop"
    c.env.data_dir = os.environ.get("WEBSHOP_DATA", "")
    c.env.train_split = "train"
    c.env.eval_splits = ("test",)
    c.env.max_steps = 15
    c.env.history_k = 2
    c.rollout.tasks_per_iter = 16
    c.rollout.group_size = 8
    c.rollout.max_prompt_tokens = 4096  # results pages are long (verl-agent's WebShop runs use 4096)
    c.advantage.mode = "mean_norm"
    c.train.mini_batch_rows = 64  # run_webshop_gigpo.sh: ppo_mini_batch_size=64
    c.wia.horizon = 1
    return c
