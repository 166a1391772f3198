"""One iteration's PPO update: the rows packed on the token grid with the log-probs that stay fixed
during it (the old policy's, the KL reference's: each pass timed), then the shuffled mini-batch epochs.
Between the two the caller frees what the update needs the memory of (`release`: the sampler's copy)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from roleagent_jax.rl.ppo import ppo_batch, ppo_epochs
from roleagent_jax.types import Row

LogProbs = Callable[[dict[str, np.ndarray]], np.ndarray]


def pack_multiple(config: Any, mesh: Any) -> int:
    """0 without `train.pack_rows`; else what a packed row count must divide by: the micro-batches
    times the mesh's batch shards."""
    c = config.train
    if not c.pack_rows:
        return 0
    return c.mini_batch_rows // c.micro_batch_rows * mesh.shape["data"] * mesh.shape["fsdp"]


def timed(fn: Callable[[Any], Any], name: str, times: dict[str, float]) -> Callable[[Any], Any]:
    """``fn`` that adds its seconds to ``times[name]`` (its result must be ready when it returns)."""

    def run(arg):
        start = time.perf_counter()
        out = fn(arg)
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
        return out

    return run


def ppo_update(
    train_step: Callable,
    state: Any,
    rows: list[Row],
    adv: np.ndarray,
    config: Any,
    it: int,
    *,
    pad_id: int,
    old_logprobs: LogProbs,
    ref_logprobs: LogProbs | None,
    frozen: Any,
    release: Callable[[], None],
    pack: int = 0,
) -> tuple[Any, dict[str, float]]:
    """The new train state and the update's metrics (``time/update/<pass>`` among them). ``config`` is the
    run's: its ``rollout``, ``wia`` and ``train`` sections size the grid and the epochs; the sampler's own
    log-probs stand for the old policy's when ``train.old_logprobs`` says so. ``pack`` > 0 packs each
    mini-batch's rows (`pack_multiple`); a guided loss weighs the expert's tokens by the iteration's
    schedule (``loss.guided``)."""
    c, times = config, {}
    packed = ppo_batch(
        rows, adv, pad_id=pad_id, max_prompt=c.rollout.max_prompt_tokens,
        max_response=max(c.rollout.max_response_tokens, c.wia.max_tokens * c.wia.train_predictor),
        mini_batch_rows=c.train.mini_batch_rows,
        old_logprobs=None if c.train.old_logprobs == "sampler" else timed(old_logprobs, "old_logprobs", times),
        ref_logprobs=None if ref_logprobs is None else timed(ref_logprobs, "ref_logprobs", times),
        train_forced=c.rollout.train_openers, pack=pack,
        guided_weight=train_step.loss_cfg.guided_weight(it, c.iterations),
    )  # fmt: skip
    release()
    state, metrics = ppo_epochs(
        train_step, state, packed, len(rows), mini_batch_rows=c.train.mini_batch_rows,
        epochs=c.train.ppo_epochs, rng=np.random.default_rng([c.seed, it]), frozen=frozen, pack=pack,
    )  # fmt: skip
    return state, {**metrics, **{f"time/update/{k}": v for k, v in times.items()}}
