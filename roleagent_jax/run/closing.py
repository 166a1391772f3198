"""A run's parts closed in turn, each whatever failed before it: a checkpointer whose last save failed
must not leave the environments' workers, the metric logs or the workdir's lock open."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def close_all(closers: Sequence[Callable[[], None] | None]) -> None:
    """Call every closer (None: a part never made); the first failure is raised after the last."""
    first: BaseException | None = None
    for close in closers:
        if close is None:
            continue
        try:
            close()
        except BaseException as err:  # noqa: BLE001 - the others must still close
            first = first or err
    if first is not None:
        raise first
