"""PPO's host-side batch: rows packed on one token grid (``pack_rows``; the grid is described in
`logprobs`), the old-policy and reference log-probs fixed before the update (``ppo_batch``), and the
epochs of shuffled mini-batch steps (``ppo_epochs``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from roleagent_jax.rl.logprobs import MODEL_KEYS, TARGET_KEY, round_up, target_index

if TYPE_CHECKING:
    from roleagent_jax.rl.optimizer import TrainState
    from roleagent_jax.rl.train_step import TrainStep

log = logging.getLogger(__name__)


def pack_rows(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    max_prompt: int | None = None,
    max_response: int | None = None,
    length_bucket: int | Sequence[int] = 64,
    response_logprobs: Sequence[Sequence[float]] | None = None,
    stats: dict[str, int] | None = None,
    forced_tokens: Sequence[int] | None = None,
    expert_tokens: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """Rows on one token grid ``[N, T]``: prompts left-padded to the longest prompt, responses right after
    them, right-padded; ``T`` rounded up to ``length_bucket`` (an int multiple, or the smallest of a list
    of sizes) so few shapes get compiled.

    Prompts longer than ``max_prompt`` lose tokens from the LEFT (the recent context matters most);
    responses longer than ``max_response`` are cut on the right. Counts are logged as a warning and,
    with ``stats``, stored as ``stats['prompts_truncated']`` / ``stats['responses_truncated']``.
    Returns numpy arrays: input_ids, attention_mask, positions (int32; positions count real tokens from
    0, padding 0), loss_mask (float32, 1 on response tokens), target_index (``target_index``: the
    response columns, where the model's head runs), and sampler_logprobs (float32, on response
    tokens) when ``response_logprobs`` is given. ``forced_tokens`` (per row, ``Row.forced_tokens``):
    leading response tokens that were given, not sampled; they stay in the input but get loss mask 0,
    so no log-prob pass scores them and the ratio, KL and entropy leave them out. ``expert_tokens``
    (per row, ``Row.expert_tokens``): leading response tokens the expert played; they are in the loss
    even when forced, and ``guided_mask`` (float32) is 1 on them, 0 elsewhere: the tokens a guided
    loss (``losses.policy_loss``) trains.
    """
    n = len(prompt_ids)
    if n == 0:
        raise ValueError("pack_rows needs at least one row")
    if len(response_ids) != n:
        raise ValueError(f"{n} prompts but {len(response_ids)} responses")
    if response_logprobs is not None and len(response_logprobs) != n:
        raise ValueError(f"{n} responses but {len(response_logprobs)} response_logprobs rows")
    prompts, responses, logprobs = [], [], []
    cut_p = cut_r = 0
    for i in range(n):
        p = np.asarray(prompt_ids[i], np.int64).reshape(-1)
        r = np.asarray(response_ids[i], np.int64).reshape(-1)
        if p.size == 0:
            raise ValueError(f"row {i} has an empty prompt: the first response token needs a predecessor")
        if max_prompt is not None and p.size > max_prompt:
            p, cut_p = p[-max_prompt:], cut_p + 1
        if max_response is not None and r.size > max_response:
            r, cut_r = r[:max_response], cut_r + 1
        if response_logprobs is not None:
            lp = np.asarray(response_logprobs[i], np.float32).reshape(-1)
            if lp.size < r.size:
                raise ValueError(f"row {i}: {lp.size} log-probs for {r.size} response tokens")
            logprobs.append(lp[: r.size])
        prompts.append(p)
        responses.append(r)
    if cut_p or cut_r:
        log.warning(
            "pack_rows: %d/%d prompts truncated from the left to %s tokens, %d responses cut to %s",
            cut_p,
            n,
            max_prompt,
            cut_r,
            max_response,
        )
    if stats is not None:
        stats["prompts_truncated"] = cut_p
        stats["responses_truncated"] = cut_r

    width_p = max(p.size for p in prompts)
    width = round_up(width_p + max(r.size for r in responses), length_bucket)
    input_ids = np.full((n, width), pad_id, np.int32)
    attention = np.zeros((n, width), np.int32)
    positions = np.zeros((n, width), np.int32)
    loss_mask = np.zeros((n, width), np.float32)
    sampler_lp = np.zeros((n, width), np.float32)
    guided = np.zeros((n, width), np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        start, end = width_p - p.size, width_p + r.size
        input_ids[i, start:width_p] = p
        input_ids[i, width_p:end] = r
        attention[i, start:end] = 1
        positions[i, start:end] = np.arange(end - start)
        loss_mask[i, width_p + (forced_tokens[i] if forced_tokens is not None else 0) : end] = 1.0
        if expert_tokens is not None:
            guided[i, width_p : width_p + min(expert_tokens[i], r.size)] = 1.0
            loss_mask[i] = np.maximum(loss_mask[i], guided[i])
        if response_logprobs is not None:
            sampler_lp[i, width_p:end] = logprobs[i] * loss_mask[i, width_p:end]
    out = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "positions": positions,
        "loss_mask": loss_mask,
        TARGET_KEY: target_index(loss_mask),
    }
    if response_logprobs is not None:
        out["sampler_logprobs"] = sampler_lp
    if expert_tokens is not None:
        out["guided_mask"] = guided
    return out


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where ``pack_segments`` put each source row: packed row ``row[i]`` (-1: left out), columns
    ``[offset[i], offset[i] + length[i])``, taken from source columns ``[start[i], start[i] + length[i])``
    of a ``[n, width]`` grid."""

    row: np.ndarray
    offset: np.ndarray
    start: np.ndarray
    length: np.ndarray
    width: int

    def unpack(self, values: np.ndarray) -> np.ndarray:
        """Packed ``[R, width]`` values back on the source grid ``[n, width]`` (0 where nothing went)."""
        out = np.zeros((len(self.row), self.width), np.asarray(values).dtype)
        for i in np.flatnonzero(self.row >= 0):
            o, s, n = self.offset[i], self.start[i], self.length[i]
            out[i, s : s + n] = values[self.row[i], o : o + n]
        return out


def pack_segments(
    grid: Mapping[str, np.ndarray], row_multiple: int = 1
) -> tuple[dict[str, np.ndarray], Packing]:
    """The rows of a ``pack_rows`` grid placed end to end in as few rows of the same width as first-fit
    decreasing finds, their count rounded up to ``row_multiple`` (micro-batches, mesh rows) so that a
    run compiles at most ``N / row_multiple`` shapes; rows with no loss token are left out.

    Each row keeps its own positions from 0, and ``attention_mask`` becomes segment ids (1, 2, ... in a
    packed row, 0 on padding) that the model reads as a block-diagonal causal mask, so every token's
    log-prob is the one it has on the unpacked grid: only the padding work goes. ``[N, T]`` arrays
    move with their rows, ``[N]`` ones (advantages) spread over their row's tokens; ``target_index``
    is recomputed. Returns the packed grid and the ``Packing`` that maps it back.
    """
    mask = np.asarray(grid["attention_mask"]) > 0
    n, width = mask.shape
    live = np.asarray(grid["loss_mask"]).any(1)
    start = mask.argmax(1)
    length = mask.sum(1)
    if not all(mask[i, start[i] : start[i] + length[i]].all() for i in np.flatnonzero(live)):
        raise ValueError("pack_segments needs each row's tokens in one contiguous span (pack_rows' grid)")
    row, offset, fill = np.full(n, -1), np.zeros(n, np.int64), []
    for i in sorted(np.flatnonzero(live), key=lambda i: -length[i]):  # stable: equal lengths keep order
        b = next((b for b, used in enumerate(fill) if used + length[i] <= width), len(fill))
        if b == len(fill):
            fill.append(0)
        row[i], offset[i] = b, fill[b]
        fill[b] += length[i]
    rows = max(round_up(len(fill), row_multiple), row_multiple)
    out: dict[str, np.ndarray] = {}
    for key, value in grid.items():
        if key == TARGET_KEY:
            continue
        value = np.asarray(value)
        out[key] = np.zeros((rows, width), value.dtype if value.ndim == 2 else np.float32)
    segment = np.zeros(rows, np.int64)
    for i in np.flatnonzero(row >= 0):
        b, o, s, k = row[i], offset[i], start[i], length[i]
        segment[b] += 1
        for key, value in grid.items():
            if key == TARGET_KEY:
                continue
            value = np.asarray(value)
            out[key][b, o : o + k] = value[i] if value.ndim == 1 else value[i, s : s + k]
        out["attention_mask"][b, o : o + k] = segment[b]
    if TARGET_KEY in grid:
        out[TARGET_KEY] = target_index(out["loss_mask"])
    return out, Packing(row, offset, start, length, width)


def padded_share(grid: Mapping[str, np.ndarray]) -> float:
    """The share of a grid's positions that hold no token of a row with a loss (padding, and rows that
    only fill a mini-batch): the work an update does for nothing."""
    mask = np.asarray(grid["attention_mask"]) > 0
    useful = mask[np.asarray(grid["loss_mask"]).any(1)].sum()
    return float(1.0 - useful / max(mask.size, 1))


def ppo_batch(
    rows: Sequence[Any],
    advantages: np.ndarray,
    *,
    pad_id: int,
    max_prompt: int,
    max_response: int,
    mini_batch_rows: int,
    old_logprobs: Callable[[dict[str, jax.Array]], np.ndarray] | None = None,
    ref_logprobs: Callable[[dict[str, jax.Array]], np.ndarray] | None = None,
    train_forced: bool = False,
    pack: int = 0,
    guided_weight: float | None = None,
) -> dict[str, np.ndarray]:
    """One iteration's rows (``types.Row``) as PPO's host batch: the token grid, advantages, and the
    old-policy and reference log-probs, padded to whole mini-batches with zero-weight rows (every
    step then has one shape and one compile).

    The log-probs are fixed for every row before the first step, so the ratio of later mini-batches
    measures how far the policy moved in this iteration. `old_logprobs=None` takes the sampler's own
    (the same quantity: log_softmax of the raw logits, prompts cut to the same limit), one forward pass
    fewer; `ref_logprobs=None` makes the reference the old policy (no KL pass). `train_forced` puts the
    rows' forced tokens in the loss like sampled ones (`rollout.train_openers`); with the sampler's
    log-probs, only rows whose forced tokens the sampler scored (`Row.forced_scored`). `pack` > 0 runs
    the log-prob passes on each mini-batch's rows packed (`pack_segments` with that row multiple), the
    same log-probs for less padding.
    `guided_weight` (`losses.LossConfig.guided_weight`; None: no guided loss) puts the expert's tokens
    (`Row.expert_tokens`) in the loss and gives the grid `guided_weight` (that weight on them, 0
    elsewhere), which the guided loss trains them by instead of the ratio; their old log-probs are then
    never read.
    """
    unscored = sum(1 for r in rows if r.forced_tokens and not r.forced_scored)
    if train_forced and old_logprobs is None and unscored:
        raise ValueError(
            f"train_forced needs old_logprobs: {unscored} rows hold forced tokens the sampler did not score "
            "(their log-prob is 0)"
        )
    packed = pack_rows(
        [r.prompt_ids for r in rows],
        [r.response_ids for r in rows],
        pad_id,
        max_prompt=max_prompt,
        max_response=max_response,
        response_logprobs=[r.logprobs for r in rows] if old_logprobs is None else None,
        forced_tokens=None if train_forced else [r.forced_tokens for r in rows],
        expert_tokens=None if guided_weight is None else [r.expert_tokens for r in rows],
    )
    if guided_weight is not None:
        packed["guided_weight"] = packed.pop("guided_mask") * np.float32(guided_weight)
    n, mb = len(rows), mini_batch_rows
    padded = -(-n // mb) * mb
    fill = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
    packed = {k: v[fill] for k, v in packed.items()}
    packed["loss_mask"][n:] = 0  # padding rows repeat row 0 but weigh nothing
    if guided_weight is not None:
        packed["guided_weight"][n:] = 0
    packed["advantages"] = advantages[fill].astype(np.float32)

    def chunked(fn: Callable[[dict[str, jax.Array]], np.ndarray]) -> np.ndarray:
        keys = (*MODEL_KEYS, "loss_mask", TARGET_KEY)
        out = []
        for s in range(0, padded, mb):
            chunk = {k: packed[k][s : s + mb] for k in keys}
            if pack:
                chunk, packing = pack_segments(chunk, pack)
                out.append(packing.unpack(np.asarray(fn({k: jnp.asarray(v) for k, v in chunk.items()}))))
            else:
                out.append(np.asarray(fn({k: jnp.asarray(v) for k, v in chunk.items()})))
        return np.concatenate(out)

    packed["old_logprobs"] = packed.pop("sampler_logprobs") if old_logprobs is None else chunked(old_logprobs)
    packed["ref_logprobs"] = chunked(ref_logprobs) if ref_logprobs is not None else packed["old_logprobs"]
    return packed


def ppo_epochs(
    train_step: TrainStep,
    state: TrainState,
    packed: dict[str, np.ndarray],
    n_rows: int,
    *,
    mini_batch_rows: int,
    epochs: int,
    rng: np.random.Generator,
    frozen: Any = None,
    pack: int = 0,
) -> tuple[TrainState, dict[str, float]]:
    """PPO epochs over shuffled mini-batches of a `ppo_batch` (its first `n_rows` rows are real; the
    padding rows stay last). `pack` > 0 packs each mini-batch's rows (`pack_segments`, that row
    multiple) after the shuffle, so the steps see the same rows as unpacked. Returns the new state,
    each metric's mean over the steps (``update/padded_share``: the share of grid positions that hold
    no row's token) and each phase's total seconds (``time/update/forward_backward``,
    ``time/update/optimizer``)."""
    padded, mb = len(packed["advantages"]), mini_batch_rows
    sums: dict[str, list[float]] = {}
    times: dict[str, float] = {}
    for _ in range(epochs):
        order = np.concatenate([rng.permutation(n_rows), np.arange(n_rows, padded)])
        for start in range(0, padded, mb):
            batch = {k: v[order[start : start + mb]] for k, v in packed.items()}
            if pack:
                batch = pack_segments(batch, pack)[0]
            sums.setdefault("update/padded_share", []).append(padded_share(batch))
            state, metrics = train_step(state, {k: jnp.asarray(v) for k, v in batch.items()}, frozen)
            for k, v in metrics.items():
                sums.setdefault(f"update/{k}", []).append(float(v))
            for k, v in getattr(train_step, "times", {}).items():  # a TrainStep times its phases
                times[f"time/update/{k}"] = times.get(f"time/update/{k}", 0.0) + v
    return state, {**{k: float(np.mean(v)) for k, v in sums.items()}, **times}
