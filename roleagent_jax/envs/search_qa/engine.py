"""The search-QA episode: search until ready, then answer; exact match decides the reward.

Each turn the agent either searches (`<search>query</search>`: the top passages come back as the
next observation, inside <information>...</information>) or answers (`<answer>...</answer>`: the episode ends with reward `win_reward`, by
default the reference's WIN_REWARD of 1.0, times the exact match). A turn with neither is invalid: nothing
is retrieved, the observation is a format reminder, and the turn is flagged (`info["valid"]`) so
the trainer applies the invalid-format penalty (INVALID_PENALTY; penalties live in the advantage,
never in the environment reward). After `max_turns` turns without an answer the episode ends at 0.

The anchor of GiGPO's step groups is the observation text: the question at the start, then the
retrieved text, so two rollouts whose queries brought back the same passages share a step group. The
format reminder is one text for every invalid turn, so those states share an anchor wherever they
occur (the aliasing GiGPO accepts for ALFWorld's "Nothing happens."). The state (`info["state"]`) is the
question and every passage retrieved so far: an invalid turn keeps it, and a second search that brings
back the first one's passages is a new state.
"""

from __future__ import annotations

from roleagent_jax.envs.search_qa.answers import exact_match
from roleagent_jax.envs.search_qa.corpus import Retriever, format_information
from roleagent_jax.envs.search_qa.expert import expert_response
from roleagent_jax.envs.search_qa.parser import ANSWER, SEARCH, Turn, parse_turn
from roleagent_jax.envs.search_qa.tasks import QATask

WIN_REWARD = 1.0  # the reference's reward for an exact match (its invalid-turn penalty: 0.01)
INVALID_PENALTY = 0.01
MAX_TURNS = 4
TOPK = 3
# What an invalid turn brings back, and how passages are printed, by `wording`: Search-R1's words (its
# corrective message; titles quoted as the corpus stores them) or the compact ones the demo was tuned on.
WORDINGS = ("search_r1", "compact")
INVALID_SEARCH_R1 = (
    "My previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again."
)
FORMAT_REMINDER = (
    "Invalid turn. To search, put the query between <search> and </search>. "
    "To give the final answer, put it between <answer> and </answer>."
)
CORRECT, WRONG = "Answer submitted: correct.", "Answer submitted: wrong."


def question_observation(question: str) -> str:
    return f"Question: {question.strip()}"


class SearchQAEnv:
    """One question at a time: reset(task) -> (obs, info); step(response) -> (obs, reward, done, info).

    `step` takes the model's response (or a canonical action, which parses the same way). With
    `expert=True` at reset, every info carries the expert's next response in `expert_plan` (generated
    questions only: the expert follows the question's plan).
    """

    def __init__(
        self,
        retriever: Retriever,
        max_turns: int = MAX_TURNS,
        topk: int = TOPK,
        win_reward: float = WIN_REWARD,
        wording: str = "search_r1",
    ):
        if max_turns < 1 or topk < 1:
            raise ValueError(f"max_turns and topk must be >= 1, got {max_turns} and {topk}")
        self.retriever, self.max_turns, self.topk = retriever, max_turns, topk
        if wording not in WORDINGS:
            raise ValueError(f"wording={wording!r}: must be one of {', '.join(WORDINGS)}")
        self.win_reward, self.wording = win_reward, wording
        self.task: QATask | None = None
        self._expert = False
        self._observations: list[str] = []
        self._actions: list[str] = []
        self._done = True
        self._last: tuple[str, dict] = ("", {})

    def reset(self, task: QATask, expert: bool = False) -> tuple[str, dict]:
        if expert and not task.plan:
            raise ValueError(
                f"task {task.id or task.question!r} has no plan: the expert plays generated questions"
            )
        self.task, self._expert = task, expert
        obs = question_observation(task.question)
        self._observations, self._actions, self._done = [], [], False
        info = self._info(obs, None, 0.0)
        self._last = (obs, info)
        return obs, info

    @property
    def turns(self) -> int:
        return len(self._actions)

    def step(self, response: str) -> tuple[str, float, bool, dict]:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        if self._done:  # stepping a finished episode changes nothing
            obs, info = self._last
            return obs, 0.0, True, info
        turn = parse_turn(response)
        self._actions.append(turn.action or "")
        em, reward = 0.0, 0.0
        if turn.kind == SEARCH:
            passages = self.retriever.retrieve([turn.content], self.topk)[0]
            obs = f"<information>{format_information(passages, self.wording == 'search_r1')}</information>"
            self._observations.append(obs)
        elif turn.kind == ANSWER:
            em = exact_match(turn.content, self.task.golds)
            reward = self.win_reward * em
            obs = CORRECT if em else WRONG
        else:
            obs = INVALID_SEARCH_R1 if self.wording == "search_r1" else FORMAT_REMINDER
        self._done = turn.kind == ANSWER or self.turns >= self.max_turns
        info = self._info(obs, turn, em)
        self._last = (obs, info)
        return obs, reward, self._done, info

    def _info(self, obs: str, turn: Turn | None, em: float) -> dict:
        assert self.task is not None
        info = {
            "won": em == 1.0,
            "em": em,
            "admissible_commands": [],  # free-form actions
            "task_type": self.task.kind,
            "goal": self.task.question,
            "golds": list(self.task.golds),
            "anchor": obs,
            "state": "\n".join([question_observation(self.task.question), *self._observations]),
            "env_failed": False,
            "step": self.turns,
            "valid": turn is None or turn.valid,
            "turn_kind": "start" if turn is None else turn.kind or "invalid",
            "answer": turn.content if turn is not None and turn.kind == ANSWER else None,
        }
        if self._expert:
            left = self.max_turns - self.turns
            info["expert_plan"] = (
                [expert_response(self.task.plan, self._observations, self._actions, left)] if left > 0 else []
            )
        return info
