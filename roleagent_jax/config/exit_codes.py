"""How the commands end, so a restart loop can tell a fault that a rerun fixes from one that needs a person.

    0    done
    1    a bug: an unexpected error, with its traceback
    2    refused or stopped on something the operator must fix: bad input, a workdir another run holds,
         checkpoints that cannot be written, a full disk, hostile model files
    3    the environment failed: more episodes lost to it (retriever down, crashed or hung workers) than
         the config allows; the last checkpoint is kept, the same command resumes once it is back
    130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: the same command resumes

Every code but 1 comes with one line on stderr (docs/scaling.md, "Faults and exit codes").
"""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

USAGE = 2
ENV_OUTAGE = 3
BUG = 1
# A disk that cannot take more: the run stops (a rerun would fail the same way until space is freed).
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; a BaseException so that no `except Exception` of the run swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def code(self) -> int:
        return 128 + self.signum


class EnvironmentOutage(RuntimeError):
    """More episodes were lost to the environment than the config allows; the message names the share."""


def os_error(err: BaseException) -> OSError | None:
    """The OSError in `err`'s cause chain (an orbax or TensorStore error wraps the one that matters)."""
    while err is not None:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        err = err.__cause__ or err.__context__
    return None


def disk_full(err: BaseException) -> OSError | None:
    """The out-of-space OSError behind `err`, if that is what it is."""
    found = os_error(err)
    return found if found is not None and found.errno in DISK_ERRNOS else None


@contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread; a second one of either ends the
    process at once (the default action), for a shutdown that itself hangs."""

    def handler(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        raise Interrupted(signum)

    saved = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
