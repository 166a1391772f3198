"""The defaults every config starts from: each key as declared, with its check and meaning, in
`roleagent_jax/config/keys.py` (list them: `python -m roleagent_jax.config`), and each family's own
settings (`env.<family>`) as the family declares them.

Override any value on the command line: `--config.rollout.group_size=4`. Unknown keys fail at start.
"""

from ml_collections import ConfigDict

from roleagent_jax.config import CONFIG


def get_config() -> ConfigDict:
    return CONFIG.build()
