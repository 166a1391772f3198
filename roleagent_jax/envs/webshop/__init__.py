"""WebShop: the text shop (search, results, item pages), its purchase score, BM25 search, WebShop's
catalogue files and a generated shop in the same format, prompts, parser and AIW pieces.

Nothing here imports JAX: environment worker processes import this package.
"""

from roleagent_jax.envs.webshop.engine import MAX_STEPS, WIN_REWARD, Shop, ShopSession, expert_action
from roleagent_jax.envs.webshop.reward import purchase_reward

__all__ = ["MAX_STEPS", "WIN_REWARD", "Shop", "ShopSession", "expert_action", "purchase_reward"]
