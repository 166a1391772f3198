"""Supervised warm start on expert trajectories, for both roles of the model.

A tiny random model cannot find a single win by chance in ALFWorld, so RL would have nothing to
reinforce; a short imitation phase teaches the answer format, a partial policy (agent role) and the
game's replies (predictor role, so WIA has something to score). Kept short on purpose: the demo wants
a model above zero but far from perfect, so that RL has room to show.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from roleagent_jax import wia
from roleagent_jax.envs.prompts import build_agent_prompt
from roleagent_jax.train_step import pack_rows
from roleagent_jax.types import Step, Trajectory

# Token-grid widths of warm-start batches: fine steps where the demo's rows lie, few compiled shapes.
_SFT_LENGTHS = (64, 96, 128, 160, 192, 224, 256, 320, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


@dataclass
class Example:
    prompt: str  # user message (chat-templated by the caller)
    target: str  # response text the model should produce
    role: str


def expert_episodes(
    envs, task_ids: Sequence[int], max_steps: int, explore: float = 0.0, seed: int = 0
) -> list[Trajectory]:
    """Play each task by following the engine's expert plan; returns the trajectories.

    With `explore` > 0 the player leaves the plan on that share of steps (a random other admissible
    command, or a repeat of its last command, which usually gets "Nothing happens.") and the engine
    replans from wherever it ends up. Every step records the expert's command for the state actually
    visited as its target (`response`) and the command played as `action`: imitation then also covers
    the states a learner's own mistakes lead to, which pure expert play never shows (DAgger's point).

    Without exploration, games with a known winning plan (generated games keep the planner's) replay it
    with the planner off: the same trajectories, without planning every step again.
    """
    if not 0.0 <= explore < 1.0:
        raise ValueError(f"explore must be in [0, 1), got {explore}")
    rng = np.random.default_rng(seed)
    known = getattr(getattr(envs, "pool", None), "expert_plans", {})
    replay = explore == 0.0 and all(int(t) in known for t in task_ids)
    resets = envs.reset(list(task_ids), expert=not replay)
    trajs, obs, infos = [], [], []
    for tid, (o, info) in zip(task_ids, resets, strict=True):
        trajs.append(Trajectory(int(tid), info.get("task_type", ""), info.get("goal", "")))
        obs.append(o)
        infos.append(info)

    def plan(i: int) -> list[str]:
        """What is left of the expert's plan for episode i."""
        if replay:
            return known[int(task_ids[i])][len(trajs[i].steps) :]
        return infos[i].get("expert_plan") or []

    active = [i for i in range(len(trajs)) if plan(i)]
    for _ in range(max_steps):
        if not active:
            break
        labels = {i: plan(i)[0] for i in active}
        actions = {i: _explore_action(rng, explore, labels[i], infos[i], trajs[i]) for i in active}
        outcomes = envs.step(actions)
        still = []
        for i in active:
            next_obs, reward, done, info = outcomes[i]
            trajs[i].steps.append(
                Step(
                    obs[i],
                    list(infos[i].get("admissible_commands", [])),
                    f"<action>{labels[i]}</action>",
                    actions[i],
                    True,
                    float(reward),
                    next_obs,
                    bool(done),
                )
            )
            trajs[i].won = trajs[i].won or bool(info.get("won"))
            obs[i], infos[i] = next_obs, info
            if not done and plan(i) and not info.get("env_failed"):
                still.append(i)
        active = still
    return trajs


def _explore_action(
    rng: np.random.Generator, explore: float, label: str, info: dict, traj: Trajectory
) -> str:
    if explore == 0.0 or rng.random() >= explore:
        return label
    if traj.steps and rng.random() < 0.3:
        return traj.steps[-1].action
    others = [a for a in info.get("admissible_commands", []) if a != label and a != "help"]
    return str(rng.choice(others)) if others else label


def examples_from_episodes(
    trajs: Sequence[Trajectory],
    history_k: int,
    horizon: int,
    predictor: bool,
    predictor_fraction: float = 1.0,
) -> list[Example]:
    """Agent examples (prompt -> <action>a</action>) and predictor examples (-> the next H replies).

    `predictor_fraction` keeps that share of the predictor examples (a fixed, evenly spread subset): their
    long targets would otherwise take most of a tiny model's capacity away from acting.
    """
    out = []
    kept = 0.0
    for traj in trajs:
        if not traj.won:
            continue
        history: list[tuple[str, str]] = []
        for t, step in enumerate(traj.steps):
            recent = history[-history_k:] if history_k else []
            prompt = build_agent_prompt(traj.goal, recent, step.observation, step.admissible, t, k=history_k)
            out.append(Example(prompt, step.response, "agent"))  # the expert's command for this state
            kept += predictor_fraction
            if predictor and kept >= 1.0:
                kept -= 1.0
                future = [s.next_observation for s in traj.steps[t : t + horizon]]
                p_prompt = wia.build_predictor_prompt(
                    traj.goal, recent, step.observation, step.action, horizon
                )
                out.append(Example(p_prompt, wia.format_predictions(future), "predictor"))
            history.append((step.observation, step.action))
    return out


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, param_sharding=None) -> Callable:
    """Jitted (params, opt_state, batch) -> (params, opt_state, loss): mean NLL of the target tokens.

    With `param_sharding` the updated params keep that layout; left to propagation, XLA may shard a small
    vector differently, and the functions compiled for the model's layout (the KL reference's log-probs)
    would then reject the warm-started params."""

    def loss_fn(params, batch):
        model = nnx.merge(graphdef, params)
        logits = model(batch["input_ids"], batch["attention_mask"], batch["positions"])
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        token_logp = jnp.take_along_axis(logp, batch["input_ids"][:, 1:, None], axis=-1)[..., 0]
        mask = batch["loss_mask"][:, 1:].astype(jnp.float32)
        return -(token_logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if param_sharding is not None:
            params = jax.lax.with_sharding_constraint(params, param_sharding)
        return params, opt_state, loss

    return step


def length_grouped_batches(lengths: Sequence[int], batch_rows: int, rng: np.random.Generator):
    """Endless batches of row indices whose lengths are close, so a batch pads little.

    Each epoch sorts the rows by length plus a random jitter of up to a tenth of the length range (so
    batches mix differently every epoch), cuts the order into batches of ``batch_rows`` and yields them
    in random order: every row appears once per epoch, and the padded tokens of random batches (about a
    third of the warm start's compute) mostly disappear. With fewer rows than a batch, rows are drawn with
    replacement."""
    lengths = np.asarray(lengths, np.float64)
    n = len(lengths)
    if n < batch_rows:
        while True:
            yield rng.choice(n, size=batch_rows, replace=True)
    jitter = 0.1 * (lengths.max() - lengths.min()) + 1.0
    while True:
        order = np.argsort(lengths + rng.uniform(0.0, jitter, n), kind="stable")
        batches = [order[i : i + batch_rows] for i in range(0, n - batch_rows + 1, batch_rows)]
        for b in rng.permutation(len(batches)):
            yield batches[b]


def run_sft(
    graphdef,
    params,
    examples: Sequence[Example],
    encode_prompt: Callable[[str], list[int]],
    encode_target: Callable[[str], list[int]],
    pad_id: int,
    *,
    steps: int,
    batch_rows: int,
    lr: float,
    seed: int,
    progress: Callable | None = None,
):
    """Adam on the examples for `steps` steps; returns (params, per-step losses)."""
    if not examples:
        raise ValueError("warm start has no examples: the expert won no game (check the task pool)")
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(optax.cosine_decay_schedule(lr, steps))
    )
    opt_state = optimizer.init(params)
    step_fn = make_sft_step(graphdef, optimizer, jax.tree.map(lambda x: x.sharding, params))
    prompts = [encode_prompt(e.prompt) for e in examples]
    targets = [encode_target(e.target) for e in examples]
    rng = np.random.default_rng(seed)
    batches = length_grouped_batches([len(p) + len(t) for p, t in zip(prompts, targets)], batch_rows, rng)
    losses = []
    iterator = range(steps) if progress is None else progress(range(steps))
    for _ in iterator:
        idx = next(batches)
        packed = pack_rows(
            [prompts[i] for i in idx], [targets[i] for i in idx], pad_id, length_bucket=_SFT_LENGTHS
        )
        batch = {k: jnp.asarray(packed[k]) for k in ("input_ids", "attention_mask", "positions", "loss_mask")}
        params, opt_state, loss = step_fn(params, opt_state, batch)
        losses.append(float(loss))
        if hasattr(iterator, "set_postfix"):
            iterator.set_postfix(loss=f"{losses[-1]:.3f}")
    return params, losses
