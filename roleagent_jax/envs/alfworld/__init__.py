"""The ALFWorld family: engine adapter (`engine`), expert (`expert`), game files and task pools
(`games`), generator of the embedded default games (`procgen`), agent prompt and parser (`prompts`),
and the AIW pieces (`taxonomy`, `goals`, `heuristic`). `family.AlfWorld` ties them to the contract.

Importing the package loads no engine (textworld, Fast Downward): only `engine`, `expert` and
`procgen` do.
"""

from roleagent_jax.envs.alfworld.family import AlfWorld
from roleagent_jax.envs.alfworld.games import TASK_TYPES, WIN_REWARD

__all__ = ["TASK_TYPES", "WIN_REWARD", "AlfWorld"]
