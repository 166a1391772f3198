"""Search QA with a pretrained model: SmolLM2-135M-Instruct on the demo's generated knowledge base.

    python -m roleagent_jax.models.smollm2                                   # once: fetch and convert
    python -m roleagent_jax.main --config=configs/search_qa_smol.py

The checkpoint's own tokenizer and chat template frame every prompt. A short warm start (one epoch
over the expert's turns on 50 training questions, batch 4, lr 5e-5) teaches the search and answer
format; each target ends with the end-of-turn token, so an answer stops there (no stop string ends
it). Then Role-Agent RL (GiGPO + WIA + AIW with the heuristic analyser) trains rank-16 LoRA adapters
on top. Evaluation runs before and after RL on the demo's 96 held-out questions.

Why the compact prompt and not the reference template: on the warm start's rows the reference
template costs 342 tokens a row against 217 for the compact one (the passages are short, so cutting
them saves nothing), and on this CPU every token is time. The compact prompt is the one the 56% first
try (PyTorch, same rows) was measured with.

Measured so far: start-up checks only. The warm start and the RL sizes are estimates from per-token
rates; no run of this config has been made yet (docs/experiments.md).
"""

from configs import search_qa_demo, smol


def get_config():
    # the knowledge base, the compact protocol, AIW's and WIA's settings
    c = smol.pretrained(search_qa_demo.get_config(), "runs/search_qa_smol")

    c.rollout.tasks_per_iter = 8
    c.rollout.max_prompt_tokens = 512  # the longest warm-start row is about 420 tokens

    c.warmstart.n_games = 50  # 116 expert turns of ~217 tokens
    c.warmstart.steps = 29  # x 4 rows: one epoch
    c.warmstart.checkpoint_every = 10
    return c
