"""Training rollouts: the model plays every slot through the shared episode loop, one sampler call a step.

The same call carries the agent prompts of step t and, in WIA `separate` mode and in the rows the agent
prompts leave idle, predictor prompts for earlier actions: one generation serves both roles of the model.
Finished environments leave the batch. The result is the list of trajectories plus one training row per agent step.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import jax

from roleagent_jax.envs.base import Family
from roleagent_jax.envs.episodes import Move, Turn, play
from roleagent_jax.models.tokenizer import PromptEncoder
from roleagent_jax.parallel import distributed
from roleagent_jax.rl.advantages import hash_anchor
from roleagent_jax.sampling import SampleRequest, SampleResult
from roleagent_jax.types import RolloutSettings, Row, Step, Trajectory
from roleagent_jax.wia.predictor import Predictor
from roleagent_jax.wia.prompts import INLINE_STOP, inline_instruction, parse_inline_prediction

EXPERT_BRANCH = "expert"  # what `branch_success` calls the branches that played the expert's step

GenerateFn = Callable[[list[SampleRequest]], list[SampleResult]]


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    rows: list[Row]
    predictions: dict[int, dict[int, list[str | None]]]  # traj_id -> step -> H predicted observations
    stats: dict[str, float] = field(default_factory=dict)
    # separate mode: (traj_id, step, prompt ids, sampled answer) of each predictor request
    predictor_samples: list[tuple[int, int, list[int], SampleResult]] = field(default_factory=list)

    @classmethod
    def merge(cls, parts: Sequence[RolloutResult]) -> RolloutResult:
        """The processes' shares of one rollout as one result: lists and predictions join, counts add
        up, and times (which overlap) are the slowest process's."""
        merged = cls([], [], {}, {})
        for part in parts:
            merged.trajectories += part.trajectories
            merged.rows += part.rows
            merged.predictions.update(part.predictions)
            merged.predictor_samples += part.predictor_samples
            for k, v in part.stats.items():
                merged.stats[k] = (
                    max(merged.stats.get(k, 0), v) if k.startswith("time") else merged.stats.get(k, 0) + v
                )
        return merged


def sharing_groups(group_ids: Sequence[int]) -> list[int | None]:
    """Each slot's sampler sharing group: its task group when other slots play it too, else None (as in
    evaluation, where every task is played once and rows keep the plain per-row layout)."""
    counts = Counter(group_ids)
    return [g if counts[g] > 1 else None for g in group_ids]


def branch_slots(groups: Sequence[Hashable | None]) -> list[tuple[int, int]]:
    """Each slot's (leader, branch): the first slot of its sharing group and the slot's rank in it; an
    ungrouped slot leads itself as branch 0 (`rollout.branch_at`)."""
    first: dict[Hashable, int] = {}
    seen: Counter = Counter()
    out = []
    for slot, g in enumerate(groups):
        if g is None:
            out.append((slot, 0))
            continue
        first.setdefault(g, slot)
        out.append((first[g], seen[g]))
        seen[g] += 1
    return out


@dataclass(frozen=True)
class Answer:
    """One slot's answer at one step, as its training row holds it: `forced` leading response tokens
    (a branch's opener) were given, not sampled, and their log-probs are 0."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    forced: int = 0
    opener: str = ""  # the forced start's text, or EXPERT_BRANCH for an expert's whole step


class SamplerAgent:
    """The model as the agent of the episode loop: one batched sampler call per step (agent requests
    first, then the predictor's), and one training row per step played.

    Branching (`rollout.branch_at` = k): before step k a task group's followers do not sample; each
    replays its leader's answer (same tokens, same log-probs), so the group reaches step k as one
    state and every slot samples there on its own. A follower whose prompt ever differs from its
    leader's (a nondeterministic env) samples on its own from then on. With `branch_openers` the
    answers at step k start with the family's action openers in turn."""

    def __init__(self, call, family: Family, encode: PromptEncoder, settings: RolloutSettings,
                 predictor: Predictor | None, predictions: dict, slot_offset: int = 0,
                 groups: Sequence[Hashable | None] = ()):  # fmt: skip
        self.call, self.family, self.encode, self.settings = call, family, encode, settings
        self.predictor, self.predictions, self.slot_offset = predictor, predictions, slot_offset
        self.groups = groups  # per slot: the sampler's sharing group of its agent prompts
        self.inline = settings.wia_mode == "inline"
        self.stop = (INLINE_STOP,) if self.inline else (family.action_stop,)
        self.suffix = inline_instruction(family.action_stop) if self.inline else ""
        self.branches = branch_slots(groups)
        size = Counter(leader for leader, _ in self.branches)  # each sharing group's slots
        # `rollout.expert_branch`: each sharing group's last slot plays the expert's step
        self.expert_slots = {
            slot for slot, (leader, rank) in enumerate(self.branches)
            if settings.expert_branch and groups[slot] is not None and rank == size[leader] - 1
        }  # fmt: skip
        if settings.branch_openers and not family.action_openers:
            raise ValueError(
                f"rollout.branch_openers=True: family {family.name!r} declares no action openers"
            )
        tokenizer = encode.tokenizer
        self.openers = [(o, tokenizer.encode(o, add_special_tokens=False)) for o in family.action_openers
                        if settings.branch_openers]  # fmt: skip
        self.strayed: set[int] = set()  # followers whose prompt left their leader's: they sample
        self.rows: list[Row] = []
        self.opened: dict[int, str] = {}  # trajectory id -> the opener its branch was forced to start with
        self.sampled: dict[int, Answer] = {}  # slot -> its answer of the current step
        self.calls = self.generated_tokens = self.replayed = 0

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None:
        s = self.settings
        replay = self._replaying(step, turns)
        own = [tr for tr in turns if tr.slot not in replay]
        for tr in own:  # the expert's branch plays the expert's step whole: nothing to sample
            if self._expert_branch(step, tr):
                action = tr.observation.expert_plan[0]
                ids = self.encode.tokenizer.encode(action, add_special_tokens=False)
                prompt = self.encode(tr.prompt + self.suffix)
                self.sampled[tr.slot] = Answer(prompt, ids, [0.0] * len(ids), action, len(ids), EXPERT_BRANCH)
        own = [tr for tr in own if tr.slot not in self.sampled]
        prompts = [self.encode(tr.prompt + self.suffix) for tr in own]
        openers = [self._opener(step, tr.slot) for tr in own]
        requests = [
            SampleRequest(
                ids + forced,
                max(1, s.max_response_tokens - len(forced)),
                stop=self.stop,
                role="agent",
                group=self.groups[tr.slot] if self.groups else None,
            )
            for tr, ids, (_, forced) in zip(own, prompts, openers, strict=True)
        ]
        if self.predictor is not None:
            requests += self.predictor.requests()
        results = self.call(requests)
        if results is None:
            return None
        self.calls += 1
        self.generated_tokens += sum(len(r.token_ids) for r in results)
        if self.predictor is not None:
            self.predictor.receive(results[len(own) :], self.predictions)
        for tr, ids, (text, forced), res in zip(own, prompts, openers, results[: len(own)], strict=True):
            logprobs = [0.0] * len(forced) + list(res.logprobs)
            self.sampled[tr.slot] = Answer(
                ids, [*forced, *res.token_ids], logprobs, text + res.text, len(forced), text
            )
        for slot, leader in replay.items():
            self.sampled[slot] = self.sampled[leader]
        self.replayed += len(replay)
        moves = []
        for tr in turns:
            text = self.sampled[tr.slot].text
            if self.inline:
                self.predictions[self.slot_offset + tr.slot][step] = [parse_inline_prediction(text)]
            moves.append(Move(text))
        return moves

    def _replaying(self, step: int, turns: list[Turn]) -> dict[int, int]:
        """follower slot -> its leader's slot, for the followers that replay their leader at `step`."""
        if step >= self.settings.branch_at:
            return {}
        prompts = {tr.slot: tr.prompt for tr in turns}
        out = {}
        for tr in turns:
            leader = self.branches[tr.slot][0]
            if leader == tr.slot or tr.slot in self.strayed:
                continue
            if prompts.get(leader) == tr.prompt:
                out[tr.slot] = leader
            else:
                self.strayed.add(tr.slot)
        return out

    def _expert_branch(self, step: int, turn: Turn) -> bool:
        """Whether `turn` is its group's expert branch (`rollout.expert_branch`: the group's last slot,
        at the branch step) and the expert has a next action there."""
        return (step == self.settings.branch_at and turn.slot in self.expert_slots
                and bool(turn.observation.expert_plan))  # fmt: skip

    def _opener(self, step: int, slot: int) -> tuple[str, list[int]]:
        """The forced start (text, token ids) of `slot`'s answer at `step`: its branch's opener at the
        branch step of a grouped slot with `branch_openers`, else nothing."""
        grouped = bool(self.groups) and self.groups[slot] is not None
        if self.openers and grouped and step == self.settings.branch_at:
            return self.openers[self.branches[slot][1] % len(self.openers)]
        return "", []

    def after_step(self, turn: Turn, traj: Trajectory, step: Step, sent: str) -> None:
        answer = self.sampled.pop(turn.slot)
        if answer.opener:
            self.opened[traj.traj_id] = answer.opener
        self.rows.append(
            Row(
                prompt_ids=answer.prompt_ids,
                response_ids=list(answer.response_ids),
                logprobs=list(answer.logprobs),
                traj_id=traj.traj_id,
                group_id=traj.group_id,
                task_id=traj.task_id,
                step_index=turn.step,
                anchor_hash=hash_anchor(turn.observation.anchor),
                reward=step.reward,
                valid=step.valid,
                done=step.done,
                anchor=turn.observation.anchor,
                state=turn.observation.state,
                forced_tokens=answer.forced,
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
    encode = PromptEncoder(tokenizer, settings.max_prompt_tokens)
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
        expert=True if settings.expert_branch else None,
    )
    stats = {
        "sampler_calls": agent.calls,
        "generated_tokens": agent.generated_tokens,
        "time_generate": timed.seconds,
        "time_env": played.time_env,
        "prompts_truncated": encode.truncated,
        "agent_steps": len(agent.rows),
        "replayed_answers": agent.replayed,
    }
    for t in played.trajectories:  # what each opener's branches won, per task type (`branch_success`)
        opener = agent.opened.get(t.traj_id)
        for key in (f"{opener}/{t.task_type}", f"{opener}/all") if opener else ():
            stats[f"branch_episodes/{key}"] = stats.get(f"branch_episodes/{key}", 0) + 1
            stats[f"branch_wins/{key}"] = stats.get(f"branch_wins/{key}", 0) + int(t.won)
    samples = predictor.samples if predictor is not None else []
    return RolloutResult(played.trajectories, agent.rows, predictions, stats, samples)


def collect_all(generate: GenerateFn, family: Family, envs, task_ids: Sequence[int], group_ids: Sequence[int],
                tokenizer, settings: RolloutSettings, seed: int = 0, iteration: int = 0) -> RolloutResult:  # fmt: skip
    """`collect` over every process: each plays its share of the slots in one global sampler batch and
    every process gets the whole, merged result (one process: `collect` itself)."""
    multi = jax.process_count() > 1
    share = distributed.process_share(len(task_ids))
    local = collect(
        generate, family, envs, task_ids[share.start : share.stop], group_ids[share.start : share.stop],
        tokenizer, settings, seed=seed, iteration=iteration, slot_offset=share.start,
        gather=distributed.allgather_objects if multi else None, rank=jax.process_index(),
    )  # fmt: skip
    return RolloutResult.merge(distributed.allgather_objects(local)) if multi else local


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
