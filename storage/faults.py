"""Crash points for fault tests: a real ``kill -9`` of this process at a named step of a protocol.

A test starts a subprocess with ``LEDGERVIEW_CRASH_AT=<point>`` (optionally ``<point>:<n>`` to crash at the n-th
time the point is reached) and checks every invariant after reopening. Unset, each point costs one comparison.
With ``LEDGERVIEW_CRASH_RECORD=<file>`` too, the process writes the point's name to that file before it dies, so
the test can tell that death from any other (a Spark driver, whose JVM a Python worker kills, dies of the lost JVM
either way).
"""

from __future__ import annotations

import os
import signal

CRASH_AT_ENV = "LEDGERVIEW_CRASH_AT"
CRASH_RECORD_ENV = "LEDGERVIEW_CRASH_RECORD"


def _parse(setting: str | None) -> tuple[str | None, int]:
    if not setting:
        return None, 0
    name, _, count = setting.partition(":")
    return name, int(count or 1)


_armed_point, _hits_left = _parse(os.environ.get(CRASH_AT_ENV))


def is_armed(point: str) -> bool:
    """True when this is the hit of ``point`` at which the process must die; the caller then calls crash()."""
    global _hits_left
    if point != _armed_point:
        return False
    _hits_left -= 1
    if _hits_left > 0:
        return False
    record = os.environ.get(CRASH_RECORD_ENV)
    if record:
        with open(record, "a") as file:  # in the page cache before the kill, which a kill -9 does not lose
            file.write(f"{point}\n")
    return True


def crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point(point: str) -> None:
    if is_armed(point):
        crash()
