"""Where a task group's rollouts branch (`rollout.branch_at`): which slots share a group and lead it, which
branches play the expert's step (`rollout.expert_slots`), and which groups won nothing (`rollout.expert_when`).
Pure functions of slot lists: the rollout asks them once per episode batch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from roleagent_jax.types import Trajectory


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


def last_slots(branches: Sequence[tuple[int, int]], k: int, leaders: set[int] | None = None) -> list[int]:
    """The slots of the last `k` branches (`branch_slots`) of each sharing group, or of the groups led by
    `leaders`: where `rollout.expert_slots` play the expert's step. The leader is never one (a group
    keeps one branch of its own however few of its slots a process holds), nor an ungrouped slot."""
    size = Counter(leader for leader, _ in branches)
    return [
        slot for slot, (leader, rank) in enumerate(branches)
        if rank >= max(size[leader] - k, 1) and (leaders is None or leader in leaders)
    ]  # fmt: skip


def groups_without_a_win(trajs: Sequence[Trajectory], branches: Sequence[tuple[int, int]],
                         branch_at: int) -> set[int]:  # fmt: skip
    """The leaders of the sharing groups none of whose episodes won and whose leader reached the branch
    step (`rollout.expert_when="no_win"`: only there can a replay of the shared prefix meet the expert's
    step)."""
    won = {leader for (leader, _), t in zip(branches, trajs, strict=True) if t.won}
    size = Counter(leader for leader, _ in branches)
    return {
        leader for leader in size
        if size[leader] > 1 and leader not in won and len(trajs[leader].steps) > branch_at
    }  # fmt: skip
