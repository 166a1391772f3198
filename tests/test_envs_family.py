"""A new scenario family added from a test module alone: registered, trained one iteration, evaluated.

"Find the key" is the walk-through family of docs/adding-an-environment.md: the key lies in one of a few
rooms; the agent goes from room to room and wins by taking it. Nothing outside this module knows it.
Keep this module's top level free of JAX: env worker processes import it to unpickle the family.
"""

import dataclasses
import random
import re

import pytest

from roleagent_jax.envs import Family, Observation, PoolRequest, Task, TaskPool, register, unregister

ROOMS = ("hall", "kitchen", "garden", "attic")


class FindKeyEnv:
    def __init__(self, max_steps: int):
        self.max_steps = max_steps

    def reset(self, task: Task, expert: bool = False) -> Observation:
        self.key, self.room, self.steps, self.expert = task.payload, "hall", 0, expert
        return self._observe(0.0, won=False)

    def step(self, action: str) -> Observation:
        if self.last.done:
            return dataclasses.replace(self.last, reward=0.0)
        self.steps += 1
        if action.startswith("go to ") and action[6:] in ROOMS:
            self.room = action[6:]
        won = action == "take key" and self.room == self.key
        return self._observe(1.0 if won else 0.0, won)

    def _observe(self, reward: float, won: bool) -> Observation:
        here = self.room == self.key and not won
        text = f"You are in the {self.room}." + (" A key lies here." if here else "")
        moves = [f"go to {r}" for r in ROOMS if r != self.room] + (["take key"] if here else [])
        plan = (
            (["take key"] if here else [f"go to {self.key}", "take key"]) if self.expert and not won else None
        )
        done = won or self.steps >= self.max_steps
        self.last = Observation(text, text, moves, reward, done, won, expert_plan=plan)
        return self.last


class FindKey(Family):
    name = "findkey"
    task_types = ("key_near", "key_far")
    empty_action = "look"
    has_expert = True
    generated_splits = ("gen",)
    failure_types = {"wandering": "went from room to room without taking the key"}

    def make_env(self, max_steps: int) -> FindKeyEnv:
        return FindKeyEnv(max_steps)

    def generated_tasks(self, request: PoolRequest) -> TaskPool:
        rng = random.Random(f"findkey:{request.seed}")
        keys = [rng.choice(ROOMS[1:]) for _ in range(request.n)]
        types = ["key_near" if k == "kitchen" else "key_far" for k in keys]
        plans = [(f"go to {k}", "take key") for k in keys]
        return TaskPool(
            [Task(f"key{i}", t, "find the key.", k, p) for i, (k, t, p) in enumerate(zip(keys, types, plans))]
        )

    def agent_prompt(self, goal, history, observation, admissible, step, history_k) -> str:
        seen = "".join(f"Saw: {o} Did: {a}\n" for o, a in (history[-history_k:] if history_k else []))
        return f"Task: {goal}\n{seen}Now: {observation}\nCommands: {' | '.join(admissible)}\nAnswer <action>...</action>"

    def parse_action(self, response, admissible):
        m = re.search(r"<action>(.*?)(?:</action>|$)", response, re.DOTALL)
        action = " ".join(m.group(1).split()) if m else ""
        if not action:
            return None, False
        return action, admissible is None or action in admissible


@pytest.fixture
def findkey():
    family = register(FindKey())
    yield family
    unregister(family.name)


def findkey_config(workdir):
    from configs import base

    c = base.get_config()
    c.env.name, c.env.train_split, c.env.eval_splits = "findkey", "gen", ("gen",)
    c.workdir, c.iterations, c.seed = str(workdir), 1, 0
    c.env.max_steps, c.env.history_k, c.env.num_workers = 4, 1, 1
    c.env.gen.n_train, c.env.gen.n_eval = 6, 4
    c.model.init.hidden_size, c.model.init.intermediate_size = 32, 64
    c.model.init.num_hidden_layers, c.model.init.num_attention_heads, c.model.init.num_key_value_heads = (
        1,
        2,
        1,
    )
    c.tokenizer.train_vocab_size = 300
    c.rollout.tasks_per_iter, c.rollout.group_size = 2, 2
    c.rollout.max_prompt_tokens, c.rollout.max_response_tokens = 256, 8
    c.wia.horizon, c.wia.max_tokens = 1, 8
    c.aiw.analyser = "heuristic"
    c.warmstart.steps, c.warmstart.batch_rows = 3, 4
    c.train.mini_batch_rows, c.train.micro_batch_rows = 8, 4
    c.eval.every, c.checkpoint.every = 0, 0
    c.log.progress, c.log.tensorboard = False, False
    return c


@pytest.mark.slow  # the learning test trains a registered family through the same code by default
def test_registered_family_trains_and_evaluates_through_the_generic_code(findkey, tmp_path, capsys):
    from roleagent_jax.envs import get_family, registered
    from roleagent_jax.evaluation import cli
    from roleagent_jax.run.trainer import Trainer

    assert "findkey" in registered() and get_family("findkey") is findkey
    trainer = Trainer(findkey_config(tmp_path))
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    assert trainer.host["iteration"] == 1 and len(trainer.logger.history) == 1
    assert set(trainer.logger.history[0]) >= {"train/success/all", "aiw/fail/wandering", "wia/lms_h1"}
    for when in ("before", "after"):
        result = summary["eval"][when]["gen"]
        assert set(result["per_type"]) <= {"key_near", "key_far"} and 0.0 <= result["success"] <= 1.0
    out = cli.main(["--env=findkey", "--split=gen", "--gen-n=5", "--num-workers=1", "--quiet"])
    assert out["n"] == 5 and out["success"] == 1.0 and out["invalid_rate"] == 0.0
    random_ = cli.main(["--env=findkey", "--policy=random", "--split=gen", "--gen-n=5", "--quiet"])
    assert random_["n"] == 5 and random_["invalid_rate"] == 0.0
    capsys.readouterr()
