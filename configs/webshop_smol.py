"""WebShop with a pretrained model: SmolLM2-135M-Instruct on the demo's generated shop, on a CPU.

    python -m roleagent_jax.models.smollm2                                   # once: fetch and convert
    python -m roleagent_jax.main --config=configs/webshop_smol.py

The checkpoint's own tokenizer and chat template (ChatML with SmolLM's system line) frame every prompt.
A short warm start (one epoch over the expert's steps on 60 training goals, batch 4, lr 5e-5) teaches
the action format and the shop's habits; then Role-Agent RL (GiGPO + WIA + AIW with WebShop's
heuristic analyser) trains rank-16 LoRA adapters on top of the warm-started weights. Evaluation runs
before and after RL on the demo's 96 held-out goals (gen_test of the same shop).

Why the compact prompt and not the reference template: on the 282 warm-start rows the reference
template costs 524 tokens a row (earlier pages cut to 160 characters; whole pages and two of them:
690) against 380 for the compact one, and on this CPU every token is time (forward ~430 tokens/s,
forward + backward ~110). The compact prompt is the one the 35% first try (PyTorch, same rows) was
measured with. A pretrained model copies the instruction's words into its search and a product id
into its click; no reasoning is imitated, so a valid action is an available one.

Not yet measured end to end: the sizes below are set from per-phase costs measured on small slices
(docs/experiments.md), not from a full run.
"""

from configs import webshop_demo
from roleagent_jax.models import smollm2


def get_config():
    c = webshop_demo.get_config()  # the shop, the compact protocol, AIW's and WIA's demo settings
    c.workdir = "runs/webshop_smol"
    c.iterations = 6

    c.model.path = str(smollm2.model_dir())
    c.model.required = True  # no checkpoint: fail at start-up (fetch it with the command above)

    c.lora.rank = 16  # RL only: 1.2-1.37x faster train steps than full fine-tuning on this shape
    c.lora.alpha = 32.0

    c.rollout.tasks_per_iter = 4
    c.rollout.group_size = 4
    c.rollout.max_response_tokens = 32  # the longest expert answer is about 20 tokens

    c.optim.lr = 2e-5  # LoRA adapters; the demo's 2e-4 was for a from-scratch tiny model
    c.train.mini_batch_rows = 32
    c.train.micro_batch_rows = 4

    c.warmstart.n_games = 60  # 282 expert steps of ~380 tokens
    c.warmstart.steps = 70  # x 4 rows: one epoch
    c.warmstart.batch_rows = 4
    c.warmstart.lr = 5e-5
    c.warmstart.predictor_fraction = 0.1  # a few predictor rows teach WIA's reply format, cheaply
    c.warmstart.checkpoint_every = 25
    c.warmstart.end_turn = True  # the chat model learns to end its turn after </action>
    return c
