"""Multi-turn rollouts: every environment steps in lockstep, one batched sampler call per step.

The same call carries the agent prompts of step t and, in WIA `separate` mode, the predictor prompts for
the actions chosen at step t-1: one generation serves both roles of the model. Finished environments
leave the batch. The result is the list of trajectories plus one training row per agent step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from roleagent_jax import wia
from roleagent_jax.advantages import hash_anchor
from roleagent_jax.envs.prompts import ACTION_STOP, build_agent_prompt, parse_action
from roleagent_jax.sampling import SampleRequest, SampleResult
from roleagent_jax.tokenizer import chat_prompt
from roleagent_jax.types import Step, Trajectory

GenerateFn = Callable[[list[SampleRequest]], list[SampleResult]]
INLINE_INSTRUCTION = (
    "\nAfter </action>, write the observation you expect next inside <predict_next>...</predict_next>."
)
INLINE_STOP = "</predict_next>"


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


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    rows: list[Row]
    predictions: dict[int, dict[int, list[str | None]]]  # traj_id -> step -> H predicted observations
    stats: dict[str, float] = field(default_factory=dict)


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


def collect(
    generate: GenerateFn,
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
    can script the model. `envs` is an EnvPool with at least len(task_ids) slots.

    Multi-host: each process plays its own slots (`slot_offset` = its first global slot, so trajectory
    ids and WIA choices do not depend on the process count) and `gather` (an all-gather of every
    process's requests) makes each sampler call one global batch, of which this process (`rank`) keeps
    its part. The loop runs until no process has anything left to generate.
    """

    def call(requests: list[SampleRequest]) -> list[SampleResult] | None:
        if gather is None:
            return generate(requests) if requests else None
        parts = gather(requests)
        flat = [r for part in parts for r in part]
        if not flat:
            return None
        offset = sum(len(part) for part in parts[:rank])
        return generate(flat)[offset : offset + len(requests)]

    n = len(task_ids)
    encode = Tokenize(tokenizer, settings.max_prompt_tokens)
    t_env = t_gen = 0.0
    start = time.perf_counter()
    resets = envs.reset(list(task_ids))
    t_env += time.perf_counter() - start
    trajs, obs, admissible, anchors = [], [], [], []
    for i, (o, info) in enumerate(resets):
        trajs.append(
            Trajectory(
                task_id=int(task_ids[i]),
                task_type=info.get("task_type", ""),
                goal=info.get("goal", ""),
                group_id=int(group_ids[i]),
                traj_id=slot_offset + i,
                env_failed=bool(info.get("env_failed", False)),
            )
        )
        obs.append(o)
        anchors.append(info.get("anchor", o))
        admissible.append(list(info.get("admissible_commands", [])))
    active = [i for i in range(n) if not trajs[i].env_failed]
    history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    rows: list[Row] = []
    predictions: dict[int, dict[int, list[str | None]]] = {slot_offset + i: {} for i in range(n)}
    pending: list[tuple[int, int, list[int]]] = []  # (slot, step, predictor prompt ids)
    calls = generated_tokens = 0
    inline = settings.wia_mode == "inline"
    agent_stop = (INLINE_STOP,) if inline else (ACTION_STOP,)

    for t in range(settings.max_steps + 1):
        agent_slots = active if t < settings.max_steps else []
        requests = []
        for i in agent_slots:
            text = build_agent_prompt(
                trajs[i].goal,
                history[i][-settings.history_k :] if settings.history_k else [],
                obs[i],
                admissible[i],
                t,
                k=settings.history_k,
            )
            requests.append(
                SampleRequest(
                    prompt_ids=encode(text + (INLINE_INSTRUCTION if inline else "")),
                    max_new_tokens=settings.max_response_tokens,
                    stop=agent_stop,
                    role="agent",
                )
            )
        for _, _, ids in pending:
            requests.append(
                SampleRequest(ids, settings.wia_max_tokens, stop=(wia.PREDICT_STOP,), role="predictor")
            )
        start = time.perf_counter()
        results = call(requests)
        if results is None:
            break
        t_gen += time.perf_counter() - start
        calls += 1
        generated_tokens += sum(len(r.token_ids) for r in results)
        for (slot, step, _), res in zip(pending, results[len(agent_slots) :], strict=True):
            predictions[slot_offset + slot][step] = wia.parse_predictions(res.text, settings.wia_horizon)
        pending = []
        if not agent_slots:
            continue

        actions, parsed = {}, {}
        for i, res in zip(agent_slots, results[: len(agent_slots)], strict=True):
            action, valid = parse_action(res.text, admissible[i])
            parsed[i] = (action, valid, res)
            actions[i] = action if action is not None else res.text.strip()[:200] or "look"
            if inline:
                predictions[slot_offset + i][t] = [wia.parse_inline_prediction(res.text)]
        start = time.perf_counter()
        outcomes = envs.step(actions)
        t_env += time.perf_counter() - start

        still_active = []
        for k, i in enumerate(agent_slots):
            action, valid, res = parsed[i]
            next_obs, reward, done, info = outcomes[i]
            failed = bool(info.get("env_failed", False))
            done = bool(done) or failed or t + 1 >= settings.max_steps
            step = Step(
                observation=obs[i],
                admissible=admissible[i],
                response=res.text,
                action=action,
                valid=valid,
                reward=float(reward),
                next_observation=next_obs,
                done=done,
            )
            trajs[i].steps.append(step)
            rows.append(
                Row(
                    prompt_ids=requests[k].prompt_ids,
                    response_ids=list(res.token_ids),
                    logprobs=list(res.logprobs),
                    traj_id=slot_offset + i,
                    group_id=trajs[i].group_id,
                    task_id=trajs[i].task_id,
                    step_index=t,
                    anchor_hash=hash_anchor(anchors[i]),
                    reward=float(reward),
                    valid=valid,
                    done=done,
                )
            )
            chosen = wia.prediction_mask(seed, iteration, [slot_offset + i], t, settings.wia_fraction)[0]
            if settings.wia_mode == "separate" and chosen:
                text = wia.build_predictor_prompt(
                    trajs[i].goal,
                    history[i][-settings.history_k :] if settings.history_k else [],
                    obs[i],
                    actions[i],
                    settings.wia_horizon,
                )
                pending.append((i, t, encode(text)))
            history[i].append((obs[i], actions[i]))
            obs[i], admissible[i] = next_obs, list(info.get("admissible_commands", []))
            anchors[i] = info.get("anchor", next_obs)
            if failed:
                trajs[i].env_failed = True
            if info.get("won"):
                trajs[i].won = True
            if not done:
                still_active.append(i)
        active = still_active

    stats = {
        "sampler_calls": calls,
        "generated_tokens": generated_tokens,
        "time_generate": t_gen,
        "time_env": t_env,
        "prompts_truncated": encode.truncated,
        "agent_steps": len(rows),
    }
    return RolloutResult(trajs, rows, predictions, stats)


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
