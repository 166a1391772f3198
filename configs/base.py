"""The defaults every config starts from: each key as declared, with its check and meaning, in
`roleagent_jax/config/keys.py` (list them: `python -m roleagent_jax.config`), and each family's own
settings (`env.<family>`) as the family declares them.

Override any value on the command line: `--config.rollout.group_size=4`. Unknown keys fail at start.
"""

import os

from ml_collections import ConfigDict

from roleagent_jax.config import CONFIG


def get_config() -> ConfigDict:
    return CONFIG.build()


def paper_run(c: ConfigDict) -> ConfigDict:
    """What the paper's runs share: Role-Agent on a pretrained Qwen2.5 ($ROLEAGENT_MODEL or
    --config.model.path), never the small random model, computed in bfloat16 with rematerialised
    activations, and the reference's sampling, advantage, loss and optimiser settings."""
    c.algo = "roleagent"
    c.model.update(path=os.environ.get("ROLEAGENT_MODEL", ""), required=True, dtype="bfloat16", remat=True)
    c.rollout.update(temperature=1.0, max_response_tokens=512)
    c.advantage.update(gamma=0.95, omega=1.0, mode="mean_std_norm")
    c.loss.kl_type = "low_var_kl"
    c.optim.lr = 1e-6
    c.train.update(micro_batch_rows=16, ppo_epochs=1)
    c.wia.mode = "separate"
    c.aiw.analyser = "llm"
    return c


def tiny_demo(c: ConfigDict) -> ConfigDict:
    """What the embedded demos share: Role-Agent on a 3-layer Qwen2 trained from scratch, with a
    1,024-token BPE fitted to the expert's play, small enough to learn on a laptop CPU within minutes;
    short prompts and answers, the heuristic analyser, and evaluation before and after RL only."""
    c.algo = "roleagent"
    c.model.path = ""
    c.model.init.update(hidden_size=128, intermediate_size=384, num_hidden_layers=3)
    c.model.init.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    c.tokenizer.train_vocab_size = 1024
    # n_eval per split: one task = 1.04 points, a 50% figure has an SE of 5.1 points
    c.env.update(num_workers=2, gen=dict(n_eval=96, seed=0))
    c.rollout.update(max_prompt_tokens=512, max_response_tokens=24)
    c.advantage.mode = "mean_norm"
    # ALFWorld at lr 1e-4: the KL to the warm start stayed near 0.01, not worth a pass
    c.loss.kl_type = "none"
    # the sampler's log-probs: one forward pass fewer (with no KL pass: update ~30 s -> ~16 s)
    c.train.update(micro_batch_rows=32, old_logprobs="sampler")
    c.wia.update(mode="separate", horizon=1, max_tokens=48)
    c.aiw.update(analyser="heuristic", retrieval="fuzzy")
    c.warmstart.update(lr=3e-3, batch_rows=32)
    # before and after RL only, at temperature 0.4: greedy decoding repeats a failed command forever
    c.eval.update(every=0, greedy=False)
    return c
