"""Supervised warm start on expert trajectories, for both roles of the model.

A tiny random model cannot find a single win by chance in a text game, so RL would have nothing to
reinforce; a short imitation phase teaches the answer format, a partial policy (agent role) and the
environment's replies (predictor role, so WIA has something to score). Kept short on purpose: the demo wants
a model above zero but far from perfect, so that RL has room to show.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from roleagent_jax import wia
from roleagent_jax.envs.base import Family
from roleagent_jax.envs.episodes import Move, Turn, play
from roleagent_jax.rl.ppo import pack_rows
from roleagent_jax.types import Trajectory

# Token-grid widths of warm-start batches: fine steps where the demo's rows lie, few compiled shapes.
_SFT_LENGTHS = (64, 96, 128, 160, 192, 224, 256, 320, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


@dataclass
class Example:
    prompt: str  # user message (chat-templated by the caller)
    target: str  # response text the model should produce
    role: str


class ExpertAgent:
    """The episode loop's agent for expert play: the expert's next action is the target of every step,
    and the action played (see `expert_episodes`)."""

    def __init__(self, family: Family, explore: float, rng: np.random.Generator, replay: bool):
        self.family, self.explore, self.rng, self.replay = family, explore, rng, replay

    def plan(self, turn: Turn) -> list[str]:
        """What is left of the expert's plan for this turn's episode."""
        if self.replay:
            return list(turn.task.expert_plan or ())[len(turn.history) :]
        return turn.observation.expert_plan or []

    def keep_playing(self, turn: Turn) -> bool:
        return bool(self.plan(turn))

    def act(self, step: int, turns: list[Turn]) -> list[Move] | None:
        if not turns:
            return None
        moves = []
        for turn in turns:
            label = self.plan(turn)[0]
            played = _explore_action(self.rng, self.explore, label, turn)
            moves.append(Move(self.family.format_action(label), played))
        return moves


def expert_episodes(
    family: Family, envs, task_ids: Sequence[int], max_steps: int, explore: float = 0.0, seed: int = 0
) -> list[Trajectory]:
    """Play each task by following the env's expert plan; returns the trajectories.

    With `explore` > 0 the player leaves the plan on that share of steps (a random other admissible
    action, or a repeat of its last action, which usually changes nothing) and the expert replans from
    wherever it ends up. Every step records the expert's action for the state actually visited as its
    target (`response`) and the action played as `action`: imitation then also covers the states a
    learner's own mistakes lead to, which pure expert play never shows (DAgger's point).

    Without exploration, tasks with a known winning plan (generated games keep the planner's) replay it
    with the expert off: the same trajectories, without planning every step again.
    """
    if not 0.0 <= explore < 1.0:
        raise ValueError(f"explore must be in [0, 1), got {explore}")
    rng = np.random.default_rng(seed)
    known = envs.pool.expert_plans
    replay = explore == 0.0 and all(int(t) in known for t in task_ids)
    agent = ExpertAgent(family, explore, rng, replay)
    return play(family, envs, task_ids, agent, max_steps=max_steps, expert=not replay).trajectories


def _explore_action(rng: np.random.Generator, explore: float, label: str, turn: Turn) -> str:
    if explore == 0.0 or rng.random() >= explore:
        return label
    if turn.history and rng.random() < 0.3:
        return turn.history[-1][1]
    others = [a for a in (turn.admissible or []) if a != label and a != "help"]
    return str(rng.choice(others)) if others else label


def examples_from_episodes(
    trajs: Sequence[Trajectory],
    family: Family,
    history_k: int,
    horizon: int,
    predictor: bool,
    predictor_fraction: float = 1.0,
    long_repeat: int = 1,
) -> list[Example]:
    """Agent examples (prompt -> the expert's answer) and predictor examples (-> the next H observations).

    `predictor_fraction` keeps that share of the predictor examples (a fixed, evenly spread subset): their
    long targets would otherwise take most of a tiny model's capacity away from acting.

    `long_repeat` > 1 gives the examples of each won episode longer than the median one that many times
    (`repeat_long_episodes`); 1 gives each example once.
    """
    blocks = episode_examples(trajs, family, history_k, horizon, predictor, predictor_fraction)
    return repeat_long_episodes(blocks, longer_than_median(trajs)[0], long_repeat)


def episode_examples(
    trajs: Sequence[Trajectory],
    family: Family,
    history_k: int,
    horizon: int,
    predictor: bool,
    predictor_fraction: float = 1.0,
) -> list[list[Example]]:
    """The examples of `examples_from_episodes`, one list per episode (empty for a lost one), each
    example once."""
    out: list[list[Example]] = []
    kept = 0.0
    for traj in trajs:
        block: list[Example] = []
        out.append(block)
        if not traj.won:
            continue
        history: list[tuple[str, str]] = []
        for t, step in enumerate(traj.steps):
            prompt = family.agent_prompt(traj.goal, history, step.observation, step.admissible, t, history_k)
            block.append(Example(prompt, step.response, "agent"))  # the expert's answer for this state
            kept += predictor_fraction
            if predictor and kept >= 1.0:
                kept -= 1.0
                future = [s.next_observation for s in traj.steps[t : t + horizon]]
                recent = history[-history_k:] if history_k else []
                p_prompt = family.predictor_prompt(traj.goal, recent, step.observation, step.action, horizon)
                block.append(Example(p_prompt, wia.format_predictions(future), "predictor"))
            history.append((step.observation, step.action))
    return out


def longer_than_median(trajs: Sequence[Trajectory]) -> tuple[list[bool], float]:
    """For each episode, whether it is won in more steps than the median won episode; and that median
    (0 when none is won)."""
    won = [len(t.steps) for t in trajs if t.won]
    median = float(np.median(won)) if won else 0.0
    return [t.won and len(t.steps) > median for t in trajs], median


def repeat_long_episodes(blocks: Sequence[list[Example]], long: Sequence[bool], repeat: int) -> list[Example]:
    """The episodes' examples in order, those of a `long` episode `repeat` times (the copies side by side).

    An expert's plans mostly have one length and more rarely a longer one (search then answer, and for
    a question that needs it, a second search before the answer). Imitation then sees the decision only
    the longer plans hold (search again instead of answering) on few examples, and the warm-started model
    nearly always takes the common plan. Copies of the long episodes' examples weight that decision up;
    the warm start's steps stay the same, so an epoch over the examples gets longer.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    return [
        e for block, is_long in zip(blocks, long, strict=True) for e in block * (repeat if is_long else 1)
    ]


def target_ids(tokenizer, text: str, end_turn: bool) -> list[int]:
    """The token ids a warm-start target trains: its text, then the EOS when `end_turn` (a chat model
    then learns to end its answer, where no stop string ends it)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [*ids, tokenizer.eos_token_id] if end_turn else ids


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


def copy_batches(tokens: Sequence[int], batch_rows: int, seed: int, lengths: tuple[int, int] = (16, 48)):
    """Endless (prompts, targets) batches of "repeat this random sequence": a random run of `tokens`, a
    separator, then the same run again as the target.

    A model trained from scratch on expert text memorises it but does not learn to copy (a product id
    from the page into a click, a name from the question into a query); trained on nothing but repeats,
    the same tiny model forms its copying circuit within a few hundred steps (docs/experiments.md). Batch
    i depends only on (seed, i), so a resumed warm start sees the same batches."""
    tokens = np.asarray(tokens, np.int64)
    if tokens.size < 2:
        raise ValueError("copy batches need at least 2 token ids to draw from")
    sep, pool = int(tokens[0]), tokens[1:]
    i = 0
    while True:
        rng = np.random.default_rng([seed, 7, i])
        runs = [
            pool[rng.integers(0, pool.size, int(rng.integers(lengths[0], lengths[1] + 1)))]
            for _ in range(batch_rows)
        ]
        yield [[*r.tolist(), sep] for r in runs], [r.tolist() for r in runs]
        i += 1


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
    checkpoint=None,
    checkpoint_every: int = 0,
    predictor_target_tokens: int = 0,
    copy_steps: int = 0,
    copy_tokens: Sequence[int] = (),
    schedule: str = "cosine",
):
    """Adam on the examples for `steps` steps; returns (params, per-step losses).

    With a `checkpoint` (a `checkpointing.Checkpointer`), the parameters, optimizer state and losses are
    saved every `checkpoint_every` steps, and a run that finds a saved step continues from it: the batch
    order is re-derived from `seed`, so the result equals that of an uninterrupted run.

    `predictor_target_tokens` > 0 cuts predictor targets to the tokens a prediction may have in RL: a
    whole results page would cost a few hundred tokens of compute per example for text the sampler
    never lets the predictor write.

    `copy_steps` > 0 puts that many steps of `copy_batches` over `copy_tokens` before the examples' steps
    (in the same optimizer run and learning-rate schedule, `copy_steps + steps` long).

    `schedule`: ``cosine`` decays the rate to 0 at the last step; ``constant`` keeps it, as a pretrained
    model's one-epoch fine-tune usually does: cosine halves the area under the rate, and one epoch
    at a pretrained model's small rate is then half trained."""
    if not examples:
        raise ValueError("warm start has no examples: the expert won no game (check the task pool)")
    total = copy_steps + steps
    if schedule == "cosine":
        rate = optax.cosine_decay_schedule(lr, total)
    elif schedule == "constant":
        rate = optax.constant_schedule(lr)
    else:
        raise ValueError(f"warm-start schedule must be cosine or constant, got {schedule!r}")
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(rate))
    opt_state = optimizer.init(params)
    step_fn = make_sft_step(graphdef, optimizer, jax.tree.map(lambda x: x.sharding, params))
    prompts = [encode_prompt(e.prompt) for e in examples]
    targets = [encode_target(e.target) for e in examples]
    if predictor_target_tokens > 0:
        targets = [
            t[:predictor_target_tokens] if e.role == "predictor" else t for e, t in zip(examples, targets)
        ]
    rng = np.random.default_rng(seed)
    grouped = length_grouped_batches([len(p) + len(t) for p, t in zip(prompts, targets)], batch_rows, rng)
    batches = itertools.chain(
        itertools.islice(copy_batches(copy_tokens, batch_rows, seed), copy_steps) if copy_steps else (),
        (([prompts[i] for i in idx], [targets[i] for i in idx]) for idx in grouped),
    )
    losses: list[float] = []
    restored = checkpoint.restore({"params": params, "opt_state": opt_state}) if checkpoint else None
    if restored is not None:
        state, host = restored
        params, opt_state, losses = state["params"], state["opt_state"], [float(x) for x in host["losses"]]
        for _ in losses:  # the batches the saved steps consumed
            next(batches)
        print(f"warm start: resumed from {checkpoint.directory} at step {len(losses)} of {total}", flush=True)
    todo = range(len(losses), total)
    iterator = todo if progress is None else progress(todo)
    for _ in iterator:
        batch_prompts, batch_targets = next(batches)
        packed = pack_rows(batch_prompts, batch_targets, pad_id, length_bucket=_SFT_LENGTHS)
        batch = {k: jnp.asarray(packed[k]) for k in ("input_ids", "attention_mask", "positions", "loss_mask")}
        params, opt_state, loss = step_fn(params, opt_state, batch)
        losses.append(float(loss))
        if hasattr(iterator, "set_postfix"):
            iterator.set_postfix(loss=f"{losses[-1]:.3f}")
        if checkpoint is not None and checkpoint_every and len(losses) % checkpoint_every == 0:
            checkpoint.save(len(losses), {"params": params, "opt_state": opt_state}, {"losses": list(losses)})
    return params, losses
