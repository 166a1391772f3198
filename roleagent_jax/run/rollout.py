"""Training rollouts: the model plays every slot through the shared episode loop, one sampler call a step.

The same call carries the agent prompts of step t and, in WIA `separate` mode and in the rows the agent
prompts leave idle, predictor prompts for earlier actions: one generation serves both roles of the model.
Finished environments leave the batch. The result is the list of trajectories plus one training row per agent step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import jax

from roleagent_jax.envs.base import Family
from roleagent_jax.envs.episodes import Move, Played, Turn, play
from roleagent_jax.models.tokenizer import PromptEncoder
from roleagent_jax.parallel import distributed
from roleagent_jax.rl.advantages import hash_anchor
from roleagent_jax.run.branching import branch_slots, groups_without_a_win, last_slots, sharing_groups
from roleagent_jax.sampling import SampleRequest, SampleResult
from roleagent_jax.types import RolloutSettings, Row, Step, Trajectory
from roleagent_jax.wia.predictor import Predictor
from roleagent_jax.wia.prompts import INLINE_STOP, inline_instruction, parse_inline_prediction

EXPERT_BRANCH = "expert"  # what `branch_success` calls the branches that played the expert's step

GenerateFn = Callable[[list[SampleRequest]], list[SampleResult]]
# an all-gather of every process's (still active, sampler requests): `global_call`
Gather = Callable[[tuple[bool, list[SampleRequest]]], list[tuple[bool, list[SampleRequest]]]]


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    rows: list[Row]
    predictions: dict[int, dict[int, list[str | None]]]  # traj_id -> step -> H predicted observations
    stats: dict[str, float] = field(default_factory=dict)
    # separate mode: (traj_id, step, prompt ids, sampled answer) of each predictor request
    predictor_samples: list[tuple[int, int, list[int], SampleResult]] = field(default_factory=list)
    # (task type, prompt ids) of each task group's state at the branch step, as its leader saw it
    branch_prompts: list[tuple[str, list[int]]] = field(default_factory=list)

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
            merged.branch_prompts += part.branch_prompts
            for k, v in part.stats.items():
                merged.stats[k] = (
                    max(merged.stats.get(k, 0), v) if k.startswith("time") else merged.stats.get(k, 0) + v
                )
        return merged


@dataclass(frozen=True)
class Answer:
    """One slot's answer at one step, as its training row holds it: `forced` leading response tokens
    (a branch's opener, the expert's step) were given, not sampled; their log-probs are the sampler's
    scores of them when they are trained (`rollout.train_openers`), else 0."""

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
    answers at step k start with the family's action openers in turn; the `expert` slots play the
    expert's next action there instead. With `train_openers` the sampler scores the forced tokens in its
    prefill (the expert's step in a request that generates nothing), so their old log-probs need no pass
    of their own. `script` (slot -> step -> (prompt, answer)) replays answers recorded in an earlier pass
    (`prefix`) while the slot's prompt is the recorded one."""

    def __init__(self, call, family: Family, encode: PromptEncoder, settings: RolloutSettings,
                 predictor: Predictor | None, predictions: dict, slot_offset: int = 0,
                 groups: Sequence[Hashable | None] = (), expert: Sequence[int] = (),
                 script: dict[int, dict[int, tuple[str, Answer]]] | None = None):  # fmt: skip
        self.call, self.family, self.encode, self.settings = call, family, encode, settings
        self.predictor, self.predictions, self.slot_offset = predictor, predictions, slot_offset
        self.groups = groups  # per slot: the sampler's sharing group of its agent prompts
        self.inline = settings.wia_mode == "inline"
        self.stop = (INLINE_STOP,) if self.inline else (family.action_stop,)
        self.suffix = inline_instruction(family.action_stop) if self.inline else ""
        self.branches = branch_slots(groups)
        self.expert_slots = set(expert)  # slots that play the expert's step at the branch step
        self.script = dict(script or {})
        self.prefix: dict[int, dict[int, tuple[str, Answer]]] = {}  # leader -> step -> (prompt, answer)
        self.branch_prompts: list[tuple[str, list[int]]] = []  # (task type, prompt ids) per group
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
        s, score = self.settings, self.settings.train_openers
        replay = self._replaying(step, turns)
        own = [tr for tr in turns if tr.slot not in replay]
        for tr in own:  # answers recorded in an earlier pass (`script`)
            recorded = self.script.get(tr.slot, {}).get(step)
            if recorded is not None and recorded[0] == tr.prompt:
                self.sampled[tr.slot] = recorded[1]
                self.replayed += 1
            elif recorded is not None:  # its state left the recorded one: it samples from now on
                del self.script[tr.slot]
        if step == s.branch_at:  # the state each group's branches start from (`opener_probs`)
            self.branch_prompts += [(tr.task.type, self.encode(tr.prompt + self.suffix)) for tr in turns
                                    if self.groups and self.groups[tr.slot] is not None
                                    and self.branches[tr.slot] == (tr.slot, 0)]  # fmt: skip
        own = [tr for tr in own if tr.slot not in self.sampled]
        prompts = {tr.slot: self.encode(tr.prompt + self.suffix) for tr in own}
        starts = {tr.slot: self._forced(step, tr) for tr in own}
        for tr in own:  # the expert's step, whole and untrained: nothing to sample or score
            text, ids, label = starts[tr.slot]
            if label == EXPERT_BRANCH and not score:
                self.sampled[tr.slot] = Answer(prompts[tr.slot], ids, [0.0] * len(ids), text, len(ids), label)
        own = [tr for tr in own if tr.slot not in self.sampled]
        requests = []
        for tr in own:  # the expert's step is only scored; an opener is scored, then continued
            _, ids, label = starts[tr.slot]
            budget = 0 if label == EXPERT_BRANCH else max(1, s.max_response_tokens - len(ids))
            group = self.groups[tr.slot] if self.groups else None
            requests.append(SampleRequest(prompts[tr.slot] + ids, budget, stop=self.stop, role="agent",
                                          group=group, score_tokens=len(ids) if score else 0))  # fmt: skip
        if self.predictor is not None:
            requests += self.predictor.requests()
        results = self.call(requests, bool(turns))
        if results is None:
            return None
        self.calls += bool(requests)
        self.generated_tokens += sum(len(r.token_ids) for r in results)
        if self.predictor is not None:
            self.predictor.receive(results[len(own) :], self.predictions)
        for tr, res in zip(own, results[: len(own)], strict=True):
            text, ids, label = starts[tr.slot]
            if score and len(res.prompt_logprobs) != len(ids):
                raise ValueError(
                    f"rollout.train_openers: the backend scored {len(res.prompt_logprobs)} of a request's "
                    f"{len(ids)} forced tokens (SampleRequest.score_tokens)"
                )
            logprobs = (res.prompt_logprobs if score else [0.0] * len(ids)) + list(res.logprobs)
            self.sampled[tr.slot] = Answer(
                prompts[tr.slot], [*ids, *res.token_ids], logprobs, text + res.text, len(ids), label
            )
        for slot, leader in replay.items():
            self.sampled[slot] = self.sampled[leader]
        self.replayed += len(replay)
        if step < s.branch_at:  # the shared prefix, for a replay from it (`rollout.expert_when="no_win"`)
            for tr in turns:
                if self.branches[tr.slot] == (tr.slot, 0):
                    self.prefix.setdefault(tr.slot, {})[step] = (tr.prompt, self.sampled[tr.slot])
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
        """Whether `turn` is one of its group's expert branches (`rollout.expert_branch`: the group's last
        `expert_slots`, at the branch step) and the expert has a next action there."""
        return (step == self.settings.branch_at and turn.slot in self.expert_slots
                and bool(turn.observation.expert_plan))  # fmt: skip

    def _forced(self, step: int, turn: Turn) -> tuple[str, list[int], str]:
        """The forced start (text, token ids, what `branch_success` calls it) of `turn`'s answer at
        `step`: the expert's whole step on the expert branch, its branch's opener at the branch step of
        a grouped slot with `branch_openers`, else nothing."""
        if self._expert_branch(step, turn):
            action = turn.observation.expert_plan[0]
            return action, self.encode.tokenizer.encode(action, add_special_tokens=False), EXPERT_BRANCH
        slot = turn.slot
        grouped = bool(self.groups) and self.groups[slot] is not None
        if self.openers and grouped and step == self.settings.branch_at:
            text, ids = self.openers[self.branches[slot][1] % len(self.openers)]
            return text, ids, text
        return "", [], ""

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
                forced_scored=bool(answer.forced) and self.settings.train_openers,
                expert_tokens=answer.forced if answer.opener == EXPERT_BRANCH else 0,
            )
        )
        if self.predictor is not None:
            self.predictor.after_step(turn, traj, sent)


def global_call(
    generate: GenerateFn, gather, rank: int
) -> Callable[[list[SampleRequest], bool], list | None]:
    """One sampler call of this process's requests; None when there is nothing to generate and no slot
    still `active` (a step whose every answer is given, replayed or the expert's, generates nothing but
    goes on: then []).

    With `gather` (an all-gather of every process's requests) the call is one global batch of which
    this process keeps its part, and None only when no process has anything left."""

    def call(requests: list[SampleRequest], active: bool = False) -> list[SampleResult] | None:
        if gather is None:
            return generate(requests) if requests else ([] if active else None)
        parts = gather((active, requests))
        flat = [r for _, part in parts for r in part]
        if not flat:
            return [] if any(busy for busy, _ in parts) else None
        offset = sum(len(part) for _, part in parts[:rank])
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
    gather: Gather | None = None,
    rank: int = 0,
) -> RolloutResult:
    """Play one episode in each env slot (slot i plays task_ids[i]) and return trajectories and rows.

    `generate` is one batched sampler call (weights and sampling settings bound by the caller), so tests
    can script the model. `envs` is an EnvPool of `family` with at least len(task_ids) slots.

    Multi-host: each process plays its own slots (`slot_offset` = its first global slot, so trajectory
    ids and WIA choices do not depend on the process count) and `gather` makes each sampler call one
    global batch (see `global_call`). The loop runs until no process has anything left to generate.

    `rollout.expert_when="no_win"`: the groups play their own branches first; then the last
    `expert_slots` of each group none of whose episodes won play again (`replay_with_expert`) and their
    episodes replace the first ones.
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
    totals = backend_totals(generate)
    always = settings.expert_branch and settings.expert_when == "always"
    expert = last_slots(branch_slots(groups), settings.expert_slots) if always else ()
    agent = SamplerAgent(timed, family, encode, settings, predictor, predictions, slot_offset, groups, expert)
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
    trajs, rows, opened = played.trajectories, agent.rows, agent.opened
    samples = predictor.samples if predictor is not None else []
    stats = {"time_env": played.time_env, "expert_replays": 0}
    counts = [agent]
    if settings.expert_branch and settings.expert_when == "no_win":
        leaders = groups_without_a_win(trajs, agent.branches, settings.branch_at)
        redo = last_slots(agent.branches, settings.expert_slots, leaders)
        if redo or gather is not None:  # every process joins each global sampler call
            again, extra = replay_with_expert(timed, family, envs, encode, settings, agent, redo,
                                              task_ids, group_ids, groups, slot_offset)  # fmt: skip
            replaced = {slot_offset + s for s in redo}
            new = {t.traj_id: t for t in extra.trajectories}
            trajs = [new.get(t.traj_id, t) for t in trajs]
            rows = [r for r in rows if r.traj_id not in replaced] + again.rows
            opened = {**{k: v for k, v in opened.items() if k not in replaced}, **again.opened}
            samples = [x for x in samples if x[0] not in replaced]
            for s, t in zip(redo, extra.trajectories, strict=True):
                predictions[slot_offset + s] = again.predictions[t.traj_id]
            stats["time_env"] += extra.time_env
            stats["expert_replays"] = len(redo)
            counts.append(again)
    stats.update({
        "sampler_calls": sum(a.calls for a in counts),
        "generated_tokens": sum(a.generated_tokens for a in counts),
        "time_generate": timed.seconds,
        "prompts_truncated": encode.truncated,
        "agent_steps": len(rows),
        "replayed_answers": sum(a.replayed for a in counts),
    })  # fmt: skip
    stats.update(backend_growth(totals, backend_totals(generate)))
    for t in trajs:  # what each opener's branches won, per task type (`branch_success`)
        opener = opened.get(t.traj_id)
        for key in (f"{opener}/{t.task_type}", f"{opener}/all") if opener else ():
            stats[f"branch_episodes/{key}"] = stats.get(f"branch_episodes/{key}", 0) + 1
            stats[f"branch_wins/{key}"] = stats.get(f"branch_wins/{key}", 0) + int(t.won)
    return RolloutResult(trajs, rows, predictions, stats, samples, agent.branch_prompts)


def replay_with_expert(call, family: Family, envs, encode: PromptEncoder, settings: RolloutSettings,
                       first: SamplerAgent, redo: Sequence[int], task_ids: Sequence[int],
                       group_ids: Sequence[int], groups: Sequence[Hashable | None],
                       slot_offset: int) -> tuple[SamplerAgent, Played]:  # fmt: skip
    """The `redo` slots played again: their group leader's recorded answers up to the branch step
    (replayed, not sampled: the environments are deterministic, so they reach the same state), the
    expert's next action there, then their own samples. The cost is bounded by the slots, and only the
    steps after the branch generate. Trajectories and rows carry the slots' own ids, as if the first
    pass had played them so; they draw no WIA prediction (separate mode: the group's mean fills in)."""
    script = {j: first.prefix.get(first.branches[s][0], {}) for j, s in enumerate(redo)}
    predictions = {slot_offset + s: {} for s in redo}
    ids = {j: slot_offset + s for j, s in enumerate(redo)}
    agent = SamplerAgent(call, family, encode, settings, None, {j: {} for j in ids}, 0,
                         [groups[s] for s in redo], range(len(redo)), script)  # fmt: skip
    played = play(family, envs, [task_ids[s] for s in redo], agent, max_steps=settings.max_steps,
                  history_k=settings.history_k, group_ids=[group_ids[s] for s in redo], expert=True)  # fmt: skip
    for t in played.trajectories:
        predictions[ids[t.traj_id]] = agent.predictions[t.traj_id]
        t.traj_id = ids[t.traj_id]
    for r in agent.rows:
        r.traj_id = ids[r.traj_id]
    agent.opened = {ids[k]: v for k, v in agent.opened.items()}
    agent.predictions = predictions
    return agent, played


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


def backend_totals(generate: GenerateFn) -> dict[str, float]:
    """The running totals of the backend behind `generate` (`backends.base.FoldedCalls.stats`); {} for a
    plain function or a backend that keeps none."""
    stats = getattr(generate, "stats", None)
    return stats() if stats is not None else {}


def backend_growth(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How much each backend total grew, as rollout stats: seconds (`time_<phase>`) as
    `time_generate/<phase>`, a part of `time_generate`; counts as `generate/<name>`."""
    out = {}
    for k, v in after.items():
        name = f"time_generate/{k[len('time_') :]}" if k.startswith("time_") else f"generate/{k}"
        out[name] = v - before.get(k, 0.0)
    return out


class _Timed:
    """A sampler call that adds up its wall time (calls that return results only)."""

    def __init__(self, call):
        self.call, self.seconds = call, 0.0

    def __call__(self, requests, active=False):
        start = time.perf_counter()
        out = self.call(requests, active)
        if out is not None:
            self.seconds += time.perf_counter() - start
        return out
