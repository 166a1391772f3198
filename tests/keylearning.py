"""Train a tiny model on the key-note family with the real trainer, from a warm start at chance.

The warm start imitates uniformly random admissible actions, not the expert: the model learns the
answer format and acts validly, but knows nothing of the note, so it starts at chance (1/6 with two
steps: the right room 1 in 3, then "take key" 1 in 2). Whatever it gains after that is RL's.
`run_learning(workdir, overrides)` is shared by the learning test and `benchmarks/credit.py`; any config
override (a LoRA rank, another algorithm) passes through it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyfamily import KeyNote

from roleagent_jax.envs import Family, TaskPool, register, unregister
from roleagent_jax.run.setup import Experts
from roleagent_jax.run.trainer import Trainer
from roleagent_jax.run.warmstart import Example

RANDOM_EPISODES_PER_TASK = 8


def random_examples(
    family: Family, pool: TaskPool, max_steps: int, history_k: int, seed: int
) -> list[Example]:
    """Agent examples whose targets are uniformly random admissible actions, over states that random
    play reaches (played in-process: the env is plain Python)."""
    rng = random.Random(seed)
    env = family.make_env(max_steps)
    out = []
    for task in pool.tasks:
        for _ in range(RANDOM_EPISODES_PER_TASK):
            obs, history = env.reset(task), []
            for step in range(max_steps):
                if obs.done or not obs.admissible:
                    break
                prompt = family.agent_prompt(task.goal, history, obs.text, obs.admissible, step, history_k)
                action = rng.choice(obs.admissible)
                out.append(Example(prompt, family.format_action(action), "agent"))
                history.append((obs.text, action))
                obs = env.step(action)
    return out


class RandomPlay(Experts):
    """The warm start's examples drawn from random play instead of the expert."""

    def examples(self) -> list[Example]:
        c = self.config
        return random_examples(self.family, self.pool(), c.env.max_steps, c.env.history_k, c.seed)


class RandomWarmStartTrainer(Trainer):
    """The real trainer, warm-started on random play."""

    experts_type = RandomPlay


def learning_config(workdir: str | Path):
    """A tiny gigpo run on key-note tasks sized for about a minute on a 2-core CPU."""
    from configs import base

    c = base.get_config()
    c.algo = "gigpo"
    c.workdir, c.seed, c.iterations = str(workdir), 0, 30
    c.env.name, c.env.train_split, c.env.eval_splits = KeyNote.name, "gen", ()
    c.env.max_steps, c.env.history_k, c.env.num_workers = 2, 0, 1
    c.env.gen.n_train = 6  # all six each iteration: every room in every batch, so no room's bias drifts
    c.mesh.data, c.mesh.fsdp = -1, 1  # a model this small: replicated weights, no gathers
    c.model.init.hidden_size, c.model.init.intermediate_size = 128, 256
    c.model.init.num_hidden_layers = 1
    c.model.init.num_attention_heads, c.model.init.num_key_value_heads = 4, 2
    c.model.init.max_position_embeddings = 256
    c.tokenizer.train_vocab_size = 512
    c.rollout.tasks_per_iter, c.rollout.group_size = 6, 8
    c.rollout.max_prompt_tokens, c.rollout.max_response_tokens = 128, 16
    c.loss.kl_type = "none"
    # Adam scales even a 0.001 entropy bonus up to full-size steps wherever the advantages vanish (zeroed,
    # or groups all alike); the answer format then dissolves into invalid text that no advantage recovers.
    c.loss.entropy_coef = 0.0
    c.optim.lr, c.optim.schedule = 1e-3, "cosine"  # constant 1e-3 collapsed to invalid text late in a run
    c.train.mini_batch_rows, c.train.micro_batch_rows, c.train.ppo_epochs = 48, 48, 4
    c.warmstart.steps, c.warmstart.batch_rows, c.warmstart.lr = 120, 32, 3e-3
    c.warmstart.predictor = False
    c.warmstart.checkpoint_every = 0
    c.eval.before, c.eval.every = False, 0
    c.checkpoint.every = 0
    c.log.progress, c.log.tensorboard = False, False
    return c


@dataclass
class LearningCurve:
    """Training success and valid-action rate per RL iteration (each sampled before that iteration's
    update, so the first entry is the warm start's)."""

    success: list[float]
    valid_rate: list[float]

    @property
    def start(self) -> float:
        return self.success[0]

    @property
    def end(self) -> float:
        """Mean of the last two iterations: one batch of 64 episodes is noisy."""
        return sum(self.success[-2:]) / len(self.success[-2:])

    def iterations_to(self, level: float) -> int | None:
        """The first iteration (1-based) whose training success reaches `level`; None if none does."""
        return next((i + 1 for i, s in enumerate(self.success) if s >= level), None)


def run_learning(workdir: str | Path, overrides: dict[str, Any] | None = None) -> LearningCurve:
    """Train with `learning_config` plus `overrides` (dotted keys, e.g. {"lora.rank": 8}); the curve."""
    c = learning_config(workdir)
    for key, value in (overrides or {}).items():
        *path, leaf = key.split(".")
        node = c
        for part in path:
            node = node[part]
        node[leaf] = value
    register(KeyNote(), replace=True)
    try:
        trainer = RandomWarmStartTrainer(c)
        try:
            trainer.run()
        finally:
            trainer.close()
    finally:
        unregister(KeyNote.name)  # the family exists for this run only
    history = trainer.logger.history
    return LearningCurve(
        [float(h["train/success/all"]) for h in history], [float(h["train/valid_rate"]) for h in history]
    )
