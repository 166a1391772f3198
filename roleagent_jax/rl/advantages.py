"""GiGPO / GRPO advantages for multi-turn rollouts, as one jitted program of segment operations.

Every (environment, step) is a training row. The host only turns arbitrary ids into dense ``int32``
segment ids (``np.unique``: trajectories, task groups, and (group, anchor-hash) step clusters) and pads
the row count to a power of two so the compiled program is reused across iterations; padded rows carry
weight 0 and never enter a statistic (padding by *duplicating* rows would distort them). Everything
else (sort by (trajectory, step), discounted returns by a segmented reverse associative scan, pooled
group means and unbiased stds, cluster statistics) happens inside one ``jax.jit`` function.

Precision: the statistics run in float64 (``jax.enable_x64`` scoped to the call, so the rest of the
program keeps JAX's 32-bit default). In float32 the last-ulp differences between mathematically equal
returns (about 1e-6 for returns near 10) are the same size as the 1e-6 std epsilon, which would turn
exact ties into advantages of +-0.5; in float64 they vanish.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from roleagent_jax.types import Row

Mode = Literal["mean_std_norm", "mean_norm"]
PenaltyLevels = Literal["both", "step", "episode"]
PENALTY_LEVELS = ("both", "step", "episode")  # the advantage.penalty_levels key
EPS = 1e-6
_MIN_BUCKET = 64
_U64 = (1 << 64) - 1


def hash_anchor(text: str) -> int:
    """Stable unsigned 64-bit hash of an anchor observation (blake2b; identical across processes and runs).

    Python's ``hash`` is salted per process, so it cannot key anchors that cross workers or resumes.
    Unsigned so a list of hashes converts with ``np.array(hashes, np.uint64)``.
    """
    if not isinstance(text, str):
        raise ValueError(f"hash_anchor expects the raw observation text (str), got {type(text).__name__}")
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=False)


def similar_anchor_hashes(
    texts: Sequence[str], group_ids: Sequence[int] | np.ndarray, threshold: float = 0.95
) -> np.ndarray:
    """Anchor hashes that merge near-identical observations (the reference's optional similarity clustering).

    Within each task group, distinct texts are visited in order of first appearance; a text joins the most
    similar existing representative whose normalised Indel similarity (as WIA's LMS) is >= ``threshold``,
    otherwise it becomes a representative itself. Each row gets ``hash_anchor`` of its representative, so
    the result feeds ``gigpo_advantages`` unchanged. ``threshold=1.0`` is exact matching. Returns uint64 [N].
    """
    from rapidfuzz import process
    from rapidfuzz.distance import Indel

    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
    groups = _ids("group_ids", group_ids, len(texts))
    rep_of: dict[tuple[int, str], str] = {}
    reps: dict[int, list[str]] = {}
    for g, text in zip(groups.tolist(), texts):
        if (g, text) in rep_of:
            continue
        pool = reps.setdefault(g, [])
        match = process.extractOne(text, pool, scorer=Indel.normalized_similarity, score_cutoff=threshold)
        if match is None:
            pool.append(text)
            rep_of[(g, text)] = text
        else:
            rep_of[(g, text)] = match[0]
    return np.array([hash_anchor(rep_of[(g, t)]) for g, t in zip(groups.tolist(), texts)], np.uint64)


# --------------------------------------------------------------------------------------------------
# jitted core (runs under float64)


def _reverse_segmented_returns(rewards, traj, step, gamma):
    """G_t = r_t + gamma * G_{t+1} within each trajectory; rows in any order."""
    order = jnp.lexsort((step, traj))
    r_rev = rewards[order][::-1]
    t_rev = traj[order][::-1]
    # In reversed order the first row of each trajectory is its last step: the recursion restarts there.
    restart = jnp.concatenate([jnp.ones((1,), bool), t_rev[1:] != t_rev[:-1]])
    coef = jnp.where(restart, 0.0, gamma).astype(rewards.dtype)

    def compose(earlier, later):
        # Each element is the affine map G -> c * G + r; composing keeps that form.
        c1, x1 = earlier
        c2, x2 = later
        return c1 * c2, c2 * x1 + x2

    _, g_rev = jax.lax.associative_scan(compose, (coef, r_rev))
    return jnp.zeros_like(rewards).at[order].set(g_rev[::-1])


def _normalise(x, seg, weight, num_segments, *, mode, singleton_zero, std_floor):
    """Per-segment (x - mean) or (x - mean) / (std + eps), pooled over the weighted rows of a segment."""
    count = jax.ops.segment_sum(weight, seg, num_segments)
    mean = jax.ops.segment_sum(x * weight, seg, num_segments) / jnp.maximum(count, 1.0)
    dev = x - mean[seg]
    var = jax.ops.segment_sum(weight * dev * dev, seg, num_segments) / jnp.maximum(count - 1.0, 1.0)
    single = count[seg] <= 1.0
    row_mean = jnp.where(single, 0.0, mean[seg])
    row_std = jnp.maximum(jnp.where(single, 1.0, jnp.sqrt(var)[seg]), std_floor)
    centred = x - row_mean
    out = centred if mode == "mean_norm" else centred / (row_std + EPS)
    return jnp.where(single, 0.0, out) if singleton_zero else out


def _withhold(adv, seg, weight, ok, num_segments):
    """Invalid rows keep no positive credit, and what they lose goes back to their segment's valid rows
    in equal shares, so every segment's sum stays zero. A cap alone would leave each won episode's
    invalid rows at 0 while the lost episodes keep their negatives: most of an update pushed down.
    A segment without a valid row keeps its advantages (nobody could take the credit)."""
    capped = jnp.where(ok > 0, adv, jnp.minimum(adv, 0.0))
    removed = jax.ops.segment_sum(weight * (adv - capped), seg, num_segments)
    n_ok = jax.ops.segment_sum(weight * ok, seg, num_segments)
    share = jnp.where(ok > 0, removed[seg] / jnp.maximum(n_ok[seg], 1.0), 0.0)
    return jnp.where(n_ok[seg] > 0, capped + share, adv)


@functools.partial(
    jax.jit, static_argnames=("num_segments", "mode", "step_level", "penalty_levels", "credit_invalid")
)
def _gigpo_core(
    rewards,
    multiplier,
    invalid,
    weight,
    traj,
    group,
    cluster,
    step,
    gamma,
    omega,
    invalid_penalty,
    std_floor,
    *,
    num_segments: int,
    mode: str,
    step_level: bool,
    penalty_levels: str,
    credit_invalid: bool,
):
    returns = _reverse_segmented_returns(rewards, traj, step, gamma)
    penalty = invalid_penalty * invalid
    step_return = returns * multiplier - (penalty if penalty_levels in ("both", "step") else 0.0)

    traj_count = jax.ops.segment_sum(weight, traj, num_segments)
    traj_total = jax.ops.segment_sum(rewards * weight, traj, num_segments)
    traj_mult = jax.ops.segment_sum(multiplier * weight, traj, num_segments) / jnp.maximum(traj_count, 1.0)
    score = (traj_total * traj_mult)[traj] - (penalty if penalty_levels in ("both", "episode") else 0.0)

    ok = 1.0 - invalid
    adv = _normalise(score, group, weight, num_segments, mode=mode, singleton_zero=False, std_floor=std_floor)
    if not credit_invalid:
        adv = _withhold(adv, group, weight, ok, num_segments)
    if step_level:
        step_adv = _normalise(
            step_return, cluster, weight, num_segments, mode=mode, singleton_zero=True, std_floor=std_floor
        )
        if not credit_invalid:
            step_adv = _withhold(step_adv, cluster, weight, ok, num_segments)
        adv = adv + omega * step_adv
    return adv


# --------------------------------------------------------------------------------------------------
# host-side preparation


def _vector(name: str, x, n: int | None) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D per-row array, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} rows but rewards has {n}: pass one value per row")
    return arr


def _ids(name: str, x, n: int) -> np.ndarray:
    arr = _vector(name, x, n)
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise ValueError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _anchor_keys(anchor_hash, n: int) -> np.ndarray:
    """Anchor hashes as int64 columns: [N] of any integer width, or [N, 2] (high, low) 32-bit halves."""
    arr = anchor_hash if isinstance(anchor_hash, np.ndarray | jax.Array) else np.asarray(anchor_hash, object)
    if arr.dtype == object and arr.ndim == 1 and all(isinstance(v, int | np.integer) for v in arr.tolist()):
        # Python ints (signed or unsigned 64-bit): exact, where np.asarray would mix them into float64.
        arr = np.array([int(v) & _U64 for v in arr.tolist()], np.uint64)
    arr = np.asarray(arr)
    if arr.dtype == object:
        arr = np.asarray(arr.tolist())
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] not in (1, 2):
        raise ValueError(
            f"anchor_hash must have shape [{n}] (64-bit hashes, see hash_anchor) or [{n}, 2] "
            f"(two 32-bit halves), got {np.shape(anchor_hash)}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"anchor_hash must be integers (hash the anchor text with hash_anchor), got dtype {arr.dtype}"
        )
    # uint64 -> int64 by reinterpretation keeps distinct hashes distinct (a cast could overflow).
    return arr.view(np.int64) if arr.dtype == np.uint64 else arr.astype(np.int64)


def _dense(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense int32 ids (0..k-1) of equal keys: 1-D values or rows of a 2-D int array (one lexsort)."""
    if keys.ndim == 1:
        keys = keys[:, None]
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    starts = np.concatenate([[True], np.any(ordered[1:] != ordered[:-1], axis=1)])
    ids = np.empty(keys.shape[0], np.int32)
    ids[order] = np.cumsum(starts) - 1
    return ids, int(starts.sum())


def _bucket(n: int) -> int:
    return max(_MIN_BUCKET, 1 << (n - 1).bit_length())


def _pad(x: np.ndarray, size: int, fill) -> np.ndarray:
    return np.concatenate([x, np.full(size - x.shape[0], fill, dtype=x.dtype)])


def _check_unit_interval(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def gigpo_advantages(
    rewards: Sequence[float] | np.ndarray,
    traj_ids: Sequence[int] | np.ndarray,
    group_ids: Sequence[int] | np.ndarray,
    step_index: Sequence[int] | np.ndarray,
    anchor_hash: Sequence[int] | np.ndarray,
    valid: Sequence[bool] | np.ndarray,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: Mode = "mean_std_norm",
    invalid_penalty: float = 0.1,
    penalty_levels: PenaltyLevels = "both",
    step_level: bool = True,
    return_multiplier: Sequence[float] | np.ndarray | None = None,
    std_floor: float = 0.0,
    credit_invalid: bool = True,
    negative_scale: float = 1.0,
) -> np.ndarray:
    """One advantage per row: ``A = A^E + omega * A^S`` (GiGPO), or ``A^E`` alone when ``step_level=False`` (GRPO).

    Inputs are per row (one row = one environment step), in any order:
      rewards      raw environment reward of the step, *without* the invalid-action penalty.
      traj_ids     trajectory id; each trajectory must lie in one task group.
      group_ids    task group (one task x G rollouts in an iteration).
      step_index   position of the step in its trajectory (unique per trajectory; only the order matters).
      anchor_hash  64-bit hash of the exact anchor observation (``hash_anchor``), or [N, 2] 32-bit halves.
      valid        False for a response without a usable action.

    Semantics (reference section 3):
      * ``G_t = r_t + gamma * G_{t+1}`` per trajectory.
      * Penalty ``p = invalid_penalty`` on an invalid row, applied to that row only, never discounted back,
        at the levels ``penalty_levels`` names: ``both`` (the reference), ``step`` or ``episode``.
      * Episode score ``s = R_traj * mbar_traj - p`` with ``R_traj`` the undiscounted total reward of the
        trajectory. ``A^E`` normalises ``s`` within the task group, pooled over all the group's step rows
        (longer trajectories weigh more): ``mean_norm`` -> ``s - mean``; ``mean_std_norm`` ->
        ``(s - mean) / (std + 1e-6)`` with the unbiased std. A group of one row uses mean 0, std 1.
      * Step return ``g_t = G_t * m_t - p``; ``A^S`` normalises ``g_t`` the same way within each cluster of
        rows sharing (task group, exact anchor hash), across trajectories and time. Singleton cluster -> 0.

    Zero sum: every task group of two or more rows sums to zero at each level (and so does every step
    cluster), in every setting but ``negative_scale < 1``. An all-fail group with no penalty is all zero.

    ``return_multiplier`` ``m_t`` (WIA's hook, default 1) scales the *task* return ``G_t`` before the
    penalty, so it reaches every step of a successful episode and leaves failed episodes (``G = 0``)
    exactly at their unshaped value. The episode score uses the trajectory's mean multiplier ``mbar``:
    the episode level compares whole episodes, so it is shaped by the prediction quality of the whole
    episode, not of one step; with a constant multiplier ``c`` both levels see the same factor ``c``.

    ``std_floor`` (default 0, i.e. exactly the reference) replaces a smaller std by the floor; a floor
    of the order of the success reward stops ``mean_std_norm`` from inflating the 0.1 penalty of an
    all-fail group into advantages near +-3 (reference pitfall).

    Two small-policy stabilisers, off by default (the published semantics):
      * ``credit_invalid=False``: an invalid row keeps no positive advantage at either level; the credit
        it loses is shared out among the valid rows of its group (its step cluster at the step level), so
        the sums stay zero. An invalid action changes nothing, yet under the published rule it shares a
        won episode's credit like any other row.
      * ``negative_scale`` in [0, 1] multiplies the negative advantages (the one setting that gives up the
        zero sum): a small policy's lost episodes are mostly correct actions.

    Returns float32 [N], aligned with the input rows.
    """
    if mode not in ("mean_std_norm", "mean_norm"):
        raise ValueError(f"mode must be 'mean_std_norm' or 'mean_norm', got {mode!r}")
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("negative_scale", negative_scale)
    if penalty_levels not in PENALTY_LEVELS:
        raise ValueError(f"penalty_levels must be one of {PENALTY_LEVELS}, got {penalty_levels!r}")
    if invalid_penalty < 0 or std_floor < 0:
        raise ValueError("invalid_penalty and std_floor must be >= 0")
    r = _vector("rewards", rewards, None).astype(np.float64)
    n = r.shape[0]
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or inf")
    traj_raw = _ids("traj_ids", traj_ids, n)
    group_raw = _ids("group_ids", group_ids, n)
    step = _ids("step_index", step_index, n)
    anchors = _anchor_keys(anchor_hash, n)
    ok = _vector("valid", valid, n).astype(bool)
    if return_multiplier is None:
        mult = np.ones(n, np.float64)
    else:
        mult = _vector("return_multiplier", return_multiplier, n).astype(np.float64)
        if not np.all(np.isfinite(mult)):
            raise ValueError("return_multiplier contains NaN or inf")
    if n == 0:
        return np.zeros((0,), np.float32)

    traj, n_traj = _dense(traj_raw)
    group, _ = _dense(group_raw)
    if _dense(np.stack([traj_raw, group_raw], 1))[1] != n_traj:
        raise ValueError(
            "a trajectory id appears in more than one task group: traj_ids must be unique per trajectory"
        )
    if _dense(np.stack([traj_raw, step], 1))[1] != n:
        raise ValueError("duplicate (traj_id, step_index) rows: each step of a trajectory must appear once")
    cluster, _ = _dense(np.concatenate([group.astype(np.int64)[:, None], anchors], axis=1))

    size = _bucket(n)
    pad_id = size - 1  # unused by real rows whenever padding exists (dense ids are < n <= size - 1)
    with jax.enable_x64(True):
        out = _gigpo_core(
            _pad(r, size, 0.0),
            _pad(mult, size, 1.0),
            _pad((~ok).astype(np.float64), size, 0.0),
            _pad(np.ones(n, np.float64), size, 0.0),
            _pad(traj, size, pad_id),
            _pad(group, size, pad_id),
            _pad(cluster, size, pad_id),
            _pad(step, size, 0),
            np.float64(gamma),
            np.float64(omega),
            np.float64(invalid_penalty),
            np.float64(std_floor),
            num_segments=size,
            mode=mode,
            step_level=bool(step_level),
            penalty_levels=penalty_levels,
            credit_invalid=bool(credit_invalid),
        )
    adv = np.asarray(out, dtype=np.float32)[:n]
    return np.where(adv < 0, np.float32(negative_scale) * adv, adv).astype(np.float32)


ANCHORS = ("state", "observation")  # the advantage.anchor key


def anchor_keys(rows: Sequence[Row], similarity: float, anchor: str) -> np.ndarray:
    """GiGPO's step-group keys of rollout rows, uint64 [N].

    ``anchor="state"`` keys a row by its family's state identity (``Row.state``), falling back to the
    observation where the family reports none; ``"observation"`` by the observation text, the reference's
    choice, which merges "Nothing happens." from every state and the same room text with any inventory.
    With ``similarity`` < 1 near-identical keys of one task group merge (``similar_anchor_hashes``).
    """
    if anchor not in ANCHORS:
        raise ValueError(f"anchor must be one of {ANCHORS}, got {anchor!r}")
    if anchor == "observation" and similarity >= 1.0:
        return np.array([r.anchor_hash for r in rows], np.uint64)
    texts = [(r.state or r.anchor) if anchor == "state" else r.anchor for r in rows]
    if similarity >= 1.0:
        return np.array([hash_anchor(t) for t in texts], np.uint64)
    return similar_anchor_hashes(texts, [r.group_id for r in rows], similarity)


def row_advantages(
    rows: Sequence[Row],
    *,
    anchor: str,
    anchor_similarity: float,
    return_multiplier: np.ndarray | None = None,
    **settings,
) -> np.ndarray:
    """``gigpo_advantages`` of rollout rows (``types.Row``), step groups keyed by ``anchor_keys``;
    ``anchor``, ``anchor_similarity`` and ``settings`` are the config's advantage section."""
    return np.asarray(
        gigpo_advantages(
            np.array([r.reward for r in rows], np.float32),
            np.array([r.traj_id for r in rows]),
            np.array([r.group_id for r in rows]),
            np.array([r.step_index for r in rows]),
            anchor_keys(rows, anchor_similarity, anchor),
            np.array([r.valid for r in rows]),
            return_multiplier=return_multiplier,
            **settings,
        )
    )
