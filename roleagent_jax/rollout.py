"""Training rollouts: the model plays every slot through the shared episode loop, one sampler call a step.

The same call carries the agent prompts of step t and, in WIA `separate` mode and in the rows the agent
prompts leave idle, predictor prompts for earlier actions: one generation serves both roles of the model.
Finished environments leave the batch. The result is the list of trajectories plus one training row per agent step.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from roleagent_jax import wia
from roleagent_jax.advantages import hash_anchor
from roleagent_jax.envs.base import Family
from roleagent_jax.episodes import Move, Turn, play
from roleagent_jax.sampling import SampleRequest, SampleResult
from roleagent_jax.tokenizer import chat_prompt
from roleagent_jax.types import Step, Trajectory

GenerateFn = Callable[[list[SampleRequest]], list[SampleResult]]
INLINE_STOP = "</predict_next>"
PREDICTION_MARGIN = 8  # tokens a prediction may run past the longest observation seen so far


def inline_instruction(action_stop: str) -> str:
    """WIA inline mode: after its action the agent writes the observation it expects next."""
    return f"\nAfter {action_stop}, write the observation you expect next inside <predict_next>...</predict_next>."


@dataclass(frozen=True)
class RolloutSettings:
    max_steps: int = 50
    history_k: int = 2
    max_prompt_tokens: int = 2048
    max_response_tokens: int = 512
    wia_mode: str = "off"  # separate | inline | off
    wia_horizon: int = 1
    wia_fraction: float = 1.0
    wia_max_tokens: int = 128


@dataclass
class Row:
    """One agent step as a training row (token ids, sampling log-probs, and what GiGPO needs)."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    traj_id: int
    group_id: int
    task_id: int
    step_index: int
    anchor_hash: int
    reward: float
    valid: bool
    done: bool
    anchor: str = ""  # the anchor itself, for similarity clustering of step groups


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    rows: list[Row]
    predictions: dict[int, dict[int, list[str | None]]]  # traj_id -> step -> H predicted observations
    stats: dict[str, float] = field(default_factory=dict)
    # separate mode: (traj_id, step, prompt ids, sampled answer) of each predictor request
    predictor_samples: list[tuple[int, int, list[int], SampleResult]] = field(default_factory=list)


class Tokenize:
    """Chat-template a user message and encode it, keeping the tail when it exceeds the budget."""

    def __init__(self, tokenizer, max_tokens: int):
        self.tokenizer, self.max_tokens, self.truncated = tokenizer, max_tokens, 0

    def __call__(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(chat_prompt(self.tokenizer, text), add_special_tokens=False)
        if len(ids) > self.max_tokens:
            self.truncated += 1
            ids = ids[-self.max_tokens :]
        return ids


def sharing_groups(group_ids: Sequence[int]) -> list[int | None]:
    """Each slot's sampler sharing group: its task group when other slots play it too, else None (as in
    evaluation, where every task is played once and rows keep the plain per-row layout)."""
    counts = Counter(group_ids)
    return [g if counts[g] > 1 else None for g in group_ids]


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

    def __init__(self, family: Family, encode: Tokenize, settings: RolloutSettings, seed: int,
                 iteration: int, groups: Sequence[Hashable | None] = ()):  # fmt: skip
        self.family, self.encode, self.settings = family, encode, settings
        self.seed, self.iteration, self.groups = seed, iteration, groups
        # (traj, step, request, what earlier calls generated of it)
        self.pending: list[tuple[int, int, SampleRequest, SampleResult | None]] = []
        # answered: (traj, step, the original prompt, everything generated over its calls)
        self.samples: list[tuple[int, int, list[int], SampleResult]] = []
        tokenizer = encode.tokenizer
        self._tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False))
        self._frame = self._tokens(wia.format_predictions([""] * settings.wia_horizon))
        self.longest = 0  # tokens of the longest observation seen so far

    def max_new_tokens(self, observation: str) -> int:
        """The request's token budget, after counting `observation` as seen."""
        self.longest = max(self.longest, self._tokens(" ".join(observation.split())))
        budget = self._frame + self.settings.wia_horizon * self.longest + PREDICTION_MARGIN
        return min(self.settings.wia_max_tokens, budget)

    def after_step(self, turn: Turn, traj: Trajectory, sent: str) -> None:
        s = self.settings
        if not wia.prediction_mask(self.seed, self.iteration, [traj.traj_id], turn.step, s.wia_fraction)[0]:
            return
        recent = turn.history[-s.history_k :] if s.history_k else []
        text = self.family.predictor_prompt(traj.goal, recent, turn.observation.text, sent, s.wia_horizon)
        group = self.groups[turn.slot] if self.groups else None
        request = SampleRequest(
            self.encode(text),
            self.max_new_tokens(turn.observation.text),
            stop=(wia.PREDICT_STOP,),
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
            predictions[traj_id][step] = wia.parse_predictions(whole.text, self.settings.wia_horizon)
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
        end = text.find(wia.PREDICT_STOP)
        return text if end < 0 else text[: end + len(wia.PREDICT_STOP)]


class SamplerAgent:
    """The model as the agent of the episode loop: one batched sampler call per step (agent requests
    first, then the predictor's), and one training row per step played."""

    def __init__(self, call, family: Family, encode: Tokenize, settings: RolloutSettings,
                 predictor: Predictor | None, predictions: dict, slot_offset: int = 0,
                 groups: Sequence[Hashable | None] = ()):  # fmt: skip
        self.call, self.family, self.encode, self.settings = call, family, encode, settings
        self.predictor, self.predictions, self.slot_offset = predictor, predictions, slot_offset
        self.groups = groups  # per slot: the sampler's sharing group of its agent prompts
        self.inline = settings.wia_mode == "inline"
        self.stop = (INLINE_STOP,) if self.inline else (family.action_stop,)
        self.suffix = inline_instruction(family.action_stop) if self.inline else ""
        self.rows: list[Row] = []
        self.sampled: dict[int, tuple[list[int], SampleResult]] = {}  # slot -> (prompt ids, result)
        self.calls = self.generated_tokens = 0

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None:
        s = self.settings
        requests = [
            SampleRequest(
                self.encode(tr.prompt + self.suffix),
                s.max_response_tokens,
                stop=self.stop,
                role="agent",
                group=self.groups[tr.slot] if self.groups else None,
            )
            for tr in turns
        ]
        if self.predictor is not None:
            requests += self.predictor.requests()
        results = self.call(requests)
        if results is None:
            return None
        self.calls += 1
        self.generated_tokens += sum(len(r.token_ids) for r in results)
        if self.predictor is not None:
            self.predictor.receive(results[len(turns) :], self.predictions)
        moves = []
        for tr, req, res in zip(turns, requests[: len(turns)], results[: len(turns)], strict=True):
            self.sampled[tr.slot] = (req.prompt_ids, res)
            if self.inline:
                self.predictions[self.slot_offset + tr.slot][step] = [wia.parse_inline_prediction(res.text)]
            moves.append(Move(res.text))
        return moves

    def after_step(self, turn: Turn, traj: Trajectory, step: Step, sent: str) -> None:
        prompt_ids, res = self.sampled.pop(turn.slot)
        self.rows.append(
            Row(
                prompt_ids=prompt_ids,
                response_ids=list(res.token_ids),
                logprobs=list(res.logprobs),
                traj_id=traj.traj_id,
                group_id=traj.group_id,
                task_id=traj.task_id,
                step_index=turn.step,
                anchor_hash=hash_anchor(turn.observation.anchor),
                reward=step.reward,
                valid=step.valid,
                done=step.done,
                anchor=turn.observation.anchor,
            )
        )
        if self.predictor is not None:
            self.predictor.after_step(turn, traj, sent)


def global_call(generate: GenerateFn, gather, rank: int) -> Callable[[list[SampleRequest]], list | None]:
    """One sampler call of this process's requests; None when there is nothing to generate.

    With `gather` (an all-gather of every process's requests) the call is one global batch of which
    this process keeps its part, and None only when no process has anything left."""

    def call(requests: list[SampleRequest]) -> list[SampleResult] | None:
        if gather is None:
            return generate(requests) if requests else None
        parts = gather(requests)
        flat = [r for part in parts for r in part]
        if not flat:
            return None
        offset = sum(len(part) for part in parts[:rank])
        return generate(flat)[offset : offset + len(requests)]

    return call


def collect(
    generate: GenerateFn,
    family: Family,
    envs,
    task_ids: Sequence[int],
    group_ids: Sequence[int],
    tokenizer,
    settings: RolloutSettings,
    seed: int = 0,
    iteration: int = 0,
    slot_offset: int = 0,
    gather: Callable[[list[SampleRequest]], list[list[SampleRequest]]] | None = None,
    rank: int = 0,
) -> RolloutResult:
    """Play one episode in each env slot (slot i plays task_ids[i]) and return trajectories and rows.

    `generate` is one batched sampler call (weights and sampling settings bound by the caller), so tests
    can script the model. `envs` is an EnvPool of `family` with at least len(task_ids) slots.

    Multi-host: each process plays its own slots (`slot_offset` = its first global slot, so trajectory
    ids and WIA choices do not depend on the process count) and `gather` makes each sampler call one
    global batch (see `global_call`). The loop runs until no process has anything left to generate.
    """
    encode = Tokenize(tokenizer, settings.max_prompt_tokens)
    predictions: dict[int, dict[int, list[str | None]]] = {slot_offset + i: {} for i in range(len(task_ids))}
    groups = sharing_groups(group_ids)
    predictor = (
        Predictor(family, encode, settings, seed, iteration, groups)
        if settings.wia_mode == "separate"
        else None
    )
    timed = _Timed(global_call(generate, gather, rank))
    agent = SamplerAgent(timed, family, encode, settings, predictor, predictions, slot_offset, groups)
    played = play(
        family,
        envs,
        task_ids,
        agent,
        max_steps=settings.max_steps,
        history_k=settings.history_k,
        group_ids=group_ids,
        slot_offset=slot_offset,
    )
    stats = {
        "sampler_calls": agent.calls,
        "generated_tokens": agent.generated_tokens,
        "time_generate": timed.seconds,
        "time_env": played.time_env,
        "prompts_truncated": encode.truncated,
        "agent_steps": len(agent.rows),
    }
    samples = predictor.samples if predictor is not None else []
    return RolloutResult(played.trajectories, agent.rows, predictions, stats, samples)


class _Timed:
    """A sampler call that adds up its wall time (calls that return results only)."""

    def __init__(self, call):
        self.call, self.seconds = call, 0.0

    def __call__(self, requests):
        start = time.perf_counter()
        out = self.call(requests)
        if out is not None:
            self.seconds += time.perf_counter() - start
        return out


def wia_multipliers(result: RolloutResult, lam: float, backend: str = "rapidfuzz"):
    """Per-row return multipliers 1 + lam * R_pre, scored in one batched LMS call, and WIA metrics."""
    trajs = result.trajectories
    scored = wia.score_batch(
        [result.predictions.get(t.traj_id, {}) for t in trajs],
        [[s.next_observation for s in t.steps] for t in trajs],
        backend=backend,
    )
    r_pre = {t.traj_id: r for t, (r, _, _) in zip(trajs, scored, strict=True)}
    stats = wia.WIAStats()
    for _, _, s in scored:
        stats.merge(s)
    r_pre_rows = np.array([r_pre[r.traj_id][r.step_index] for r in result.rows], dtype=np.float32)
    metrics = stats.summary()
    metrics["wia/r_pre_mean"] = float(r_pre_rows.mean()) if len(r_pre_rows) else 0.0
    return wia.return_multiplier(r_pre_rows, lam), metrics
