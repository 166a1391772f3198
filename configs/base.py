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


def paper_model(c: ConfigDict) -> ConfigDict:
    """The paper's runs: a pretrained Qwen2.5 ($ROLEAGENT_MODEL or --config.model.path), never the small
    random model, computed in bfloat16 with rematerialised activations."""
    c.model.path = os.environ.get("ROLEAGENT_MODEL", "")
    c.model.required = True
    c.model.dtype = "bfloat16"
    c.model.remat = True
    return c


def tiny_model(c: ConfigDict) -> ConfigDict:
    """The embedded demos' model: a 3-layer Qwen2 trained from scratch, with a 1,024-token BPE fitted to
    the expert's play, small enough to learn on a laptop CPU within minutes."""
    c.model.path = ""
    c.model.init.update(hidden_size=128, intermediate_size=384, num_hidden_layers=3)
    c.model.init.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    c.tokenizer.train_vocab_size = 1024
    return c
