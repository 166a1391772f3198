"""Which rows of a sampler call share a prompt head, and the group-major layout that stores it once.

Requests that declare the same `group` (and have the same `role`) are one sharing group: the longest
common token prefix of their prompts is prefilled once, its KV stored once, and every row keeps only
its own suffix and generated tokens. At least the last prompt token stays in each row's suffix (its
logits start generation), so identical prompts share all but one token; a row that scores its prompt's
last k tokens keeps k + 1 (the prefill's logits score only the rows' own tokens).

The call's rows form a ``[groups, rows_per_group]`` grid: a sharing group fills consecutive rows of
one grid group (several grid groups when it is larger than the row count), ungrouped requests fill
grid groups with an empty prefix, and unused rows idle. Grid groups are split over the batch mesh
axes whole, so each device holds its groups' prefixes beside their rows. The layout is chosen by a
token count (prefilled tokens plus row-steps of decoding, with buckets' padding) and is only used when
it beats the plain per-row layout.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixLayout:
    """A shared-prefix layout of one sampler call.

    slots: int ``[groups * rows_per_group]``, the request each grid row serves (-1 = idle row).
    prefix_len: int ``[groups]``, the shared prefix tokens of each grid group (0 = none).
    prefix_bucket / suffix_bucket: the padded prefix length and per-row prompt length.
    """

    rows_per_group: int
    slots: np.ndarray
    prefix_len: np.ndarray
    prefix_bucket: int
    suffix_bucket: int

    @property
    def groups(self) -> int:
        return len(self.prefix_len)

    @property
    def rows(self) -> int:
        return len(self.slots)

    def row_prefix_len(self) -> np.ndarray:
        """Shared prefix tokens in front of each grid row."""
        return np.repeat(self.prefix_len, self.rows_per_group)


def common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix all prompts share: that of the first and last in sorted
    order, found by bisection over slice comparisons (the sampler's planner asks this many times)."""
    lists = [list(p) for p in prompts]
    if not lists:
        return 0
    first, last = min(lists), max(lists)
    lo, hi = 0, min(len(first), len(last))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if first[:mid] == last[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def sharing_groups(
    prompts: Sequence[Sequence[int]],
    keys: Sequence[Hashable | None],
    keep: Sequence[int] | None = None,
) -> tuple[list[tuple[list[int], int]], list[int]]:
    """``([(member request indices, shared prefix length), ...], ungrouped indices)``.

    Requests with equal non-None keys form a group; a group shares its common prefix capped so that
    every member keeps at least ``keep[i]`` tokens of its own (default 1). Groups of one request, or
    with nothing to share, are returned as ungrouped.
    """
    keep = [1] * len(prompts) if keep is None else keep
    members: dict[Hashable, list[int]] = {}
    loose: list[int] = []
    for i, key in enumerate(keys):
        if key is None:
            loose.append(i)
        else:
            members.setdefault(key, []).append(i)
    groups = []
    for idx in members.values():
        share = min(common_prefix_len([prompts[i] for i in idx]), min(len(prompts[i]) - keep[i] for i in idx))
        if len(idx) > 1 and share > 0:
            groups.append((idx, share))
        else:
            loose.extend(idx)
    return groups, sorted(loose)


def group_units(keys: Sequence[Hashable | None], size: int) -> list[list[int]]:
    """The indices that must share a call: each sharing group (in order of its first request) in parts
    of at most ``size``, each ungrouped request alone."""
    units: list[list[int]] = []
    by_key: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if key is None:
            units.append([i])
        elif key in by_key:
            by_key[key].append(i)
        else:
            by_key[key] = [i]
            units.append(by_key[key])
    return [unit[start : start + size] for unit in units for start in range(0, len(unit), size)]


def chunk_by_group(keys: Sequence[Hashable | None], size: int) -> list[list[int]]:
    """Request indices of each call when one call holds at most ``size`` requests: whole sharing groups
    (in order of their first request) packed in order into calls, a group larger than a call split.
    Without keys these are consecutive runs of ``size`` requests."""
    calls: list[list[int]] = [[]]
    for part in group_units(keys, size):
        if len(calls[-1]) + len(part) > size:
            calls.append([])
        calls[-1].extend(part)
    return calls


def _bucket(n: int, buckets: Sequence[int]) -> int | None:
    return next((b for b in buckets if b >= n), None)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _units(groups: list[tuple[list[int], int]], loose: list[int], size: int) -> list[tuple[list[int], int]]:
    """Grid groups of at most ``size`` rows: (request indices, shared prefix length)."""
    parts = [(idx[i : i + size], share) for idx, share in groups for i in range(0, len(idx), size)]
    return parts + [(loose[i : i + size], 0) for i in range(0, len(loose), size)]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _group_count(units: int, size: int, batch_buckets: Sequence[int], row_multiple: int) -> int | None:
    """Grid groups of ``size`` rows for ``units`` used ones: whole groups covering the smallest batch
    bucket that holds their rows up to the last one's first (so a grid exceeds a bucket by less than a
    group), a multiple of ``row_multiple``; None when no bucket is large enough."""
    rows = _bucket((units - 1) * size + 1, batch_buckets)
    return None if rows is None else _round_up(max(units, -(-rows // size)), row_multiple)


def plan_layout(
    prompts: Sequence[Sequence[int]],
    keys: Sequence[Hashable | None],
    *,
    new_tokens: int,
    prompt_buckets: Sequence[int],
    batch_buckets: Sequence[int],
    row_multiple: int = 1,
    keep: Sequence[int] | None = None,
) -> PrefixLayout | None:
    """The cheapest shared-prefix layout of these requests, or None when sharing would not save work
    over the plain layout (rows of the bucketed longest prompt).

    Cost in token slots (the KV cache's size, and what prefill and decoding process): ``groups *
    prefix_bucket`` prefilled once, plus per row its ``suffix_bucket`` prompt tokens and ``new_tokens``
    decode steps. Rows per group are powers of two up to the largest sharing group or a sharing
    group's exact size (groups of 5 fill grid groups of 5); the grid covers a batch bucket (calls
    reuse a few batch shapes) and its group count is a multiple of ``row_multiple`` (the batch shards,
    which must hold whole groups). ``keep``: each row's fewest own prompt tokens (`sharing_groups`).
    """
    groups, loose = sharing_groups(prompts, keys, keep)
    return layout_of_groups(
        [len(p) for p in prompts], groups, loose, new_tokens=new_tokens, prompt_buckets=prompt_buckets,
        batch_buckets=batch_buckets, row_multiple=row_multiple,
    )  # fmt: skip


def layout_of_groups(
    lengths: Sequence[int],
    groups: list[tuple[list[int], int]],
    loose: list[int],
    *,
    new_tokens: int,
    prompt_buckets: Sequence[int],
    batch_buckets: Sequence[int],
    row_multiple: int = 1,
) -> PrefixLayout | None:
    """`plan_layout` of prompts of these ``lengths`` given their `sharing_groups` (which a caller that
    plans many subsets of one call's requests computes once per group)."""
    if not groups:
        return None
    shared_len = {i: share for idx, share in groups for i in idx}
    prefix_bucket = _bucket(max(share for _, share in groups), prompt_buckets)
    suffix_bucket = _bucket(max(n - shared_len.get(i, 0) for i, n in enumerate(lengths)), prompt_buckets)
    plain_rows = _round_up(_bucket(len(lengths), batch_buckets), row_multiple)
    best, best_cost = None, plain_rows * (_bucket(max(lengths), prompt_buckets) + new_tokens)
    largest = _pow2_at_least(max(len(idx) for idx, _ in groups))
    for size in sorted({1 << k for k in range(largest.bit_length())} | {len(idx) for idx, _ in groups}):
        units = _units(groups, loose, size)
        count = _group_count(len(units), size, batch_buckets, row_multiple)
        if count is None:
            continue
        cost = count * prefix_bucket + count * size * (suffix_bucket + new_tokens)
        if cost < best_cost or (best is not None and cost == best_cost):  # ties: more rows per group
            best, best_cost = (size, units, count), cost
    if best is None:
        return None
    size, units, count = best
    slots = [i for idx, _ in units for i in idx + [-1] * (size - len(idx))]
    prefix_len = [share for _, share in units] + [0] * (count - len(units))
    slots += [-1] * ((count - len(units)) * size)
    return PrefixLayout(
        size, np.asarray(slots, np.int64), np.asarray(prefix_len, np.int64), prefix_bucket, suffix_bucket
    )
