"""WIA's predictor in the rollout: the world role's requests ride on the agent's sampler calls, and its
answers become each step's predictions."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from roleagent_jax.envs.episodes import Turn
from roleagent_jax.models.tokenizer import PromptEncoder
from roleagent_jax.sampling import SampleRequest, SampleResult
from roleagent_jax.types import RolloutSettings, Trajectory
from roleagent_jax.wia.prompts import PREDICT_STOP, format_predictions, parse_predictions, prediction_mask

if TYPE_CHECKING:
    from roleagent_jax.envs.base import Family

PREDICTION_MARGIN = 8  # tokens a prediction may run past the longest observation seen so far


class Predictor:
    """WIA's hook on the episode loop: after a chosen step, queue a predictor prompt for the action just
    sent; the queue rides on the next sampler call and its answers become that step's predictions.

    Predictor rows never widen or lengthen a sampler call: they are background rows, which take only
    the rows the agent prompts leave idle in their batch bucket and decode only while the agent rows
    do; cut off or left out, they continue in a later call (prompt plus the tokens so far, the rest of
    their budget), and those still waiting after the last agent step run to their end, in calls of the
    agent calls' batch shape (so they compile no program of their own after the first iteration). A
    prediction is an observation, so that budget is the tokens of the longest observation seen so far
    (in the prediction format, plus a margin), never more than `wia_max_tokens`.
    """

    def __init__(self, family: Family, encode: PromptEncoder, settings: RolloutSettings, seed: int,
                 iteration: int, groups: Sequence[Hashable | None] = ()):  # fmt: skip
        self.family, self.encode, self.settings = family, encode, settings
        self.seed, self.iteration, self.groups = seed, iteration, groups
        # (traj, step, request, what earlier calls generated of it)
        self.pending: list[tuple[int, int, SampleRequest, SampleResult | None]] = []
        # answered: (traj, step, the original prompt, everything generated over its calls)
        self.samples: list[tuple[int, int, list[int], SampleResult]] = []
        tokenizer = encode.tokenizer
        self._tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False))
        self._frame = self._tokens(format_predictions([""] * settings.wia_horizon))
        self.longest = 0  # tokens of the longest observation seen so far

    def max_new_tokens(self, observation: str) -> int:
        """The request's token budget, after counting `observation` as seen."""
        self.longest = max(self.longest, self._tokens(" ".join(observation.split())))
        budget = self._frame + self.settings.wia_horizon * self.longest + PREDICTION_MARGIN
        return min(self.settings.wia_max_tokens, budget)

    def after_step(self, turn: Turn, traj: Trajectory, sent: str) -> None:
        s = self.settings
        if not prediction_mask(self.seed, self.iteration, [traj.traj_id], turn.step, s.wia_fraction)[0]:
            return
        recent = turn.history[-s.history_k :] if s.history_k else []
        text = self.family.predictor_prompt(traj.goal, recent, turn.observation.text, sent, s.wia_horizon)
        group = self.groups[turn.slot] if self.groups else None
        request = SampleRequest(
            self.encode(text),
            self.max_new_tokens(turn.observation.text),
            stop=(PREDICT_STOP,),
            role="predictor",
            group=group,
            background=True,
        )
        self.pending.append((traj.traj_id, turn.step, request, None))

    def requests(self) -> list[SampleRequest]:
        return [request for _, _, request, _ in self.pending]

    def receive(self, results: Sequence[SampleResult], predictions: dict) -> None:
        going = []
        for (traj_id, step, request, before), res in zip(self.pending, results, strict=True):
            whole = res if before is None else replace(
                res,
                token_ids=before.token_ids + res.token_ids,
                logprobs=before.logprobs + res.logprobs,
                text=self._joined(before.token_ids, res),
            )  # fmt: skip
            if res.finish_reason == "paused":
                more = replace(
                    request,
                    prompt_ids=request.prompt_ids + res.token_ids,
                    max_new_tokens=request.max_new_tokens - len(res.token_ids),
                )
                going.append((traj_id, step, more, whole))
                continue
            predictions[traj_id][step] = parse_predictions(whole.text, self.settings.wia_horizon)
            earlier = len(before.token_ids) if before is not None else 0  # continued rows carry them
            prompt = request.prompt_ids[: len(request.prompt_ids) - earlier]
            self.samples.append((traj_id, step, prompt, whole))
        self.pending = going

    def _joined(self, so_far: list[int], res: SampleResult) -> str:
        """The text of a prediction generated over several calls, cut like the sampler cuts one."""
        ids = so_far + (res.token_ids[:-1] if res.finish_reason == "eos" else res.token_ids)
        text = self.encode.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        end = text.find(PREDICT_STOP)
        return text if end < 0 else text[: end + len(PREDICT_STOP)]
