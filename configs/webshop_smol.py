"""WebShop with a pretrained model: SmolLM2-135M-Instruct on the demo's generated shop, on a CPU.

    python -m roleagent_jax.models.smollm2                                   # once: fetch and convert
    python -m roleagent_jax.main --config=configs/webshop_smol.py

The checkpoint's own tokenizer and chat template (ChatML with SmolLM's system line) frame every prompt.
A warm start (about one epoch over the expert's steps on 120 training goals, batch 4, lr 5e-5) teaches
the action format and the shop's habits; then Role-Agent RL (GiGPO + WIA + AIW with WebShop's
heuristic analyser) trains rank-16 LoRA adapters on top of the warm-started weights. Evaluation runs
before and after RL on the demo's 96 held-out goals (gen_test of the same shop).

Why the compact prompt and not the reference template: on the 282 warm-start rows the reference
template costs 524 tokens a row (earlier pages cut to 160 characters; whole pages and two of them:
690) against 380 for the compact one, and on this CPU every token is time (forward ~430 tokens/s,
forward + backward ~110). The compact prompt is the one the 35% first try (PyTorch, same rows) was
measured with. A pretrained model copies the instruction's words into its search and a product id
into its click; no reasoning is imitated, so a valid action is an available one.

Measured (docs/experiments.md, 2-core CPU): the warm start takes about 34 minutes alone and reaches
57.3% held-out success greedy (55 of 96 goals, score 84.1%); on 60 goals, as the PyTorch reference
trains, it reaches 26.0% (14 of the reference's 48 goals against its 17).
RL at the settings below (6 iterations of 4 goals x 4 episodes, about 4 minutes each), seed 0, greedy
on the 96 goals: roleagent 61.5% (+4.2 +- 5.1 paired), gigpo (--config.algo=gigpo) 63.5% (+6.2 +- 3.9;
seed 1: +2.1 +- 2.6; the two seeds +4.2 +- 2.5). The whole run is about 73 minutes alone, summed from
its timed parts (not timed as one command). From the 60-goal warm start at lr 6e-4 RL lost 8.3
points: the policy drifted into invalid actions.
"""

from configs import smol, webshop_demo


def get_config():
    # the shop, the compact protocol, AIW's and WIA's demo settings
    c = smol.pretrained(webshop_demo.get_config(), "runs/webshop_smol")

    c.rollout.tasks_per_iter = 4
    # 96 evaluation goals in one sampler call held over 20 GB (prompts of ~600 tokens) and the kernel
    # killed the run on the 24 GB machine; 32 rows a call keep it to a few GB
    c.rollout.max_rows_per_call = 32

    # 60 goals (282 expert steps) reach 26% held-out, as the PyTorch reference on the same rows; 120
    # goals reach 57%: at this size the model lacks examples, not a better loss
    c.warmstart.n_games = 120  # 626 rows (agent and predictor) of ~380 tokens
    c.warmstart.steps = 140  # x 4 rows: 0.9 of an epoch
    c.warmstart.checkpoint_every = 25

    # adapters on the top 8 of 30 layers, 16-row mini-batches (several optimizer steps an iteration), 6
    # iterations; lr 2e-4: at 6e-4 the policy drifted into invalid actions within 4 iterations
    c.lora.layers = 8
    c.optim.lr = 2e-4
    c.train.mini_batch_rows = 16

    c.eval.greedy = True  # as the PyTorch reference plays the held-out goals
    return c
