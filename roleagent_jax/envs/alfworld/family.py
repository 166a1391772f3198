"""ALFWorld as a scenario family: the household text games of alfworld on TextWorld's PDDL engine.

Splits: the real ones (train, valid_seen, valid_unseen, valid_train; `alfworld-download`, then
$ALFWORLD_DATA or --data) and the generated ones (gen_seen, gen_unseen; `procgen.py`, no download).
Importing this module loads no engine: the env (textworld, Fast Downward) is imported by `make_env`
in the worker processes, the generator only when games are made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from roleagent_jax.envs.alfworld import games, goals, heuristic, prompts, taxonomy
from roleagent_jax.envs.alfworld.reference_prompt import build_reference_prompt
from roleagent_jax.envs.base import Admissible, Env, Family, History, PoolRequest, TaskPool
from roleagent_jax.envs.predictor_prompt import PredictorFraming
from roleagent_jax.envs.text import VALIDITY_RULES, matching_command, reference_action

PROMPTS = ("reference", "compact")  # the reference runs' ALFWORLD_TEMPLATE | a short one for tiny models


class AlfWorld(Family):
    """ALFWorld. `expert_type`: 'planner' (Fast Downward; every data version) or 'handcoded' (alfworld's
    rule-based expert; the packaged grammar's verbs, so generated games only)."""

    name = "alfworld"
    task_types = games.TASK_TYPES
    action_stop = prompts.ACTION_STOP
    empty_action = "look"
    has_expert = True
    data_splits = games.DATA_SPLITS
    generated_splits = tuple(games.GEN_POOLS)
    # num_receptacles, num_objects: generated rooms (procgen.GenSize defaults). prompt: the reference
    # template or the compact one; valid: the reference's format rule or "the command is available".
    gen_options = {
        "num_receptacles": (4, 6),
        "num_objects": (2, 4),
        "prompt": "reference",
        "valid": "format",
    }
    predictor_framing = PredictorFraming(
        intro="Act as the game engine. Predict what the game prints next.",
        reply="the game's reply",
        replies="game replies",
    )
    analysis_intro = "You review a failed attempt at a household text game and explain why it failed."
    failure_types = taxonomy.FAILURE_TYPES
    failure_keywords = taxonomy.FAILURE_KEYWORDS
    pattern_keywords = goals.PATTERN_KEYWORDS

    def __init__(self, expert_type: str = "planner"):
        self.expert_type = expert_type

    def start_worker(self) -> None:
        """Textworld's rule-string parsers remember their parses in this worker (steps ~3x faster)."""
        from roleagent_jax.envs.alfworld.engine import memoize_textworld_parsers

        memoize_textworld_parsers()

    def make_env(self, max_steps: int) -> Env:
        from roleagent_jax.envs.alfworld.engine import AlfWorldEnv

        return AlfWorldEnv(max_steps, self.expert_type)

    def generated_tasks(self, request: PoolRequest) -> TaskPool:
        """gen_seen / gen_unseen: n generated games under gen_dir (None: $ROLEAGENT_GEN_DIR or the user
        cache)."""
        if request.n < 1:
            raise ValueError(f"a generated split needs n >= 1 games, got {request.n}")
        size = {k: request.options[k] for k in ("num_receptacles", "num_objects")}
        from roleagent_jax.envs.alfworld.procgen import generated_pool  # the generator, when needed

        folder = request.gen_dir or games.default_gen_dir()
        return generated_pool(folder, request.n, request.seed, games.GEN_POOLS[request.split], **size)

    def data_tasks(self, request: PoolRequest) -> TaskPool:
        """train, valid_seen, valid_unseen, valid_train: a folder of real ALFWorld data."""
        return games.pool_from_split(request.data_dir or None, request.split, request.on_corrupt)

    def check_data(self, split: str, data_dir: str | Path | None = None) -> None:
        games.split_dir(data_dir or None, split)

    def check_options(self, options: Mapping[str, Any]) -> None:
        from roleagent_jax.envs.alfworld.procgen import GenSize

        GenSize(options["num_receptacles"], options["num_objects"]).ranges()
        if options["prompt"] not in PROMPTS:
            raise ValueError(f"prompt={options['prompt']!r}: must be one of {', '.join(PROMPTS)}")
        if options["valid"] not in VALIDITY_RULES:
            raise ValueError(f"valid={options['valid']!r}: must be one of {', '.join(VALIDITY_RULES)}")

    def agent_prompt(
        self, goal: str, history: History, observation: str, admissible: Admissible, step: int, history_k: int
    ) -> str:
        if self.options["prompt"] == "reference":
            return build_reference_prompt(goal, history, observation, list(admissible or []), step, history_k)
        recent = list(history[-history_k:]) if history_k else []
        return prompts.build_agent_prompt(
            goal, recent, observation, list(admissible or []), step, k=history_k
        )

    def parse_action(self, response: str, admissible: Sequence[str] | None) -> tuple[str | None, bool]:
        """The prompt sets the answer's form (the reference template's `<think>` block, or the compact
        prompt's action alone), the validity rule what passes: a well-formed answer (`format`, the
        reference's: the env answers an unavailable command itself) or a listed command (`available`).
        Without a list (`admissible=None`) availability cannot be judged, so the form alone decides."""
        if self.options["prompt"] == "reference":
            action, formed = reference_action(response)
        else:
            action, formed = prompts.parse_action(response, None)
        if action is None:
            return None, False
        command = matching_command(action, admissible or [])
        if self.options["valid"] == "available" and admissible is not None:
            return (command, formed) if command is not None else (action, False)
        return command or action, formed

    def format_action(self, action: str) -> str:
        """The reference template's answers carry their (here empty) reasoning block too."""
        answer = super().format_action(action)
        return f"<think></think>{answer}" if self.options["prompt"] == "reference" else answer

    def analyse_failure(self, traj, max_steps: int):
        return heuristic.analyse(traj, max_steps)

    def abstract_goal(self, goal: str, task_type: str) -> str:
        return goals.abstract_goal(goal, task_type)

    def pattern_name(self, task_type: str) -> str:
        return goals.pattern_name(task_type)

    def pattern_text(self, task_type: str) -> str:
        return goals.pattern_text(task_type)
