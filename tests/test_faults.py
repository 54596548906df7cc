"""Fault tests: a real appender process (tests/processes/appender.py) is killed with SIGKILL, at random moments and
at every injected crash point of the append, roll, flush and atomic-write protocols, and the store is checked on
reopen in this process.

Invariants checked (DESIGN.md):

1. An acknowledged append, flushed per the topic's flush policy, survives ``kill -9``; the torn tail a crash
   leaves is cut back to the last whole batch (never more, never a partial append call), no ``*.tmp`` leftover
   of an interrupted atomic write survives reopening, and the log takes further appends.
2. Offsets and order never change: offsets run contiguously from 0, values 0..n-1 in order, no duplicate, no gap.
8. Across processes: the appender and this test are different processes on the same data folder.

Half the random-kill trials use ``flush.messages=1`` (every acknowledged append is flushed before it returns);
the other half use the default policy, where nothing is fsynced before a roll: ``kill -9`` leaves the page cache
intact, so every acknowledged message must survive there too, and recovery then starts further back.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow as pa
import pytest

from storage import Store
from storage.files import TEMP_SUFFIX
from tests.processes.children import Child
from tests.processes.plan import APPENDER_MOST, call_ends_through, number_value

pytestmark = pytest.mark.fault

TOPIC = "numbers"
TINY_FLUSHED = {"segment.bytes": "4096", "index.interval.bytes": "256", "flush.messages": "1"}
"""Rolls every few appends, an index entry every few batches, an fsync before every acknowledgement."""
TINY_UNFLUSHED = {"segment.bytes": "4096", "index.interval.bytes": "256"}
KILLED = -9
"""Popen's return code of a child that died by SIGKILL."""
MORE = 7
"""Messages appended after the crash, to show the log still takes appends."""


def create_topic(data_dir: Path, config: dict[str, str]) -> None:
    with Store.open(data_dir) as store:
        store.create_topic(TOPIC, config=config)


def numbers(start: int, stop: int) -> list[bytes]:
    return [number_value(n) for n in range(start, stop)]


def acknowledged_through(lines: list[str]) -> int:
    """The number of the last message the appender reported acknowledged (-1 if none)."""
    return int(lines[-1]) if lines else -1


def check_after_crash(data_dir: Path, *, seed: int, acknowledged: int, temporary_files_allowed: bool) -> int:
    """Reopen the store after the appender died and check invariants 1 and 2; returns the recovered end offset.

    Every message up to ``acknowledged`` is there exactly once, offsets run from 0 without a gap, values are the
    numbers in order; what lies past ``acknowledged`` is at most the one append call the appender was making or
    had not yet reported, and only whole (each call is a single batch: at most 50 tiny messages); unless
    allowed, no ``*.tmp`` file is left. Then the log takes further appends, which read back, also after another
    reopen.
    """
    with Store.open(data_dir) as store:
        start, end = store.start_offset(TOPIC, 0), store.end_offset(TOPIC, 0)
        table = store.read(TOPIC, 0)
        assert start == 0
        assert table["offset"].to_pylist() == list(range(end)), "offsets are not contiguous from 0"
        assert table["value"].to_pylist() == numbers(0, end), "values out of order, duplicated or missing"
        assert end > acknowledged, f"acknowledged message {acknowledged} lost: the log ends at {end}"
        calls = call_ends_through(seed, APPENDER_MOST, end)
        assert end == 0 or end == calls[-1], f"log ends at {end}, inside the append call ending at {calls[-1]}"
        unreported = [call_end for call_end in calls if call_end > acknowledged + 1]
        assert len(unreported) <= 1, f"acknowledged through {acknowledged}, yet the calls ending {unreported} exist"
        leftovers = sorted(str(path.relative_to(data_dir)) for path in data_dir.rglob(f"*{TEMP_SUFFIX}"))
        assert temporary_files_allowed or not leftovers, f"temporary files left after reopening: {leftovers}"

        result = store.append(TOPIC, pa.table({"value": pa.array(numbers(end, end + MORE), pa.binary())}),
                              partition=0)
        assert result.offsets.tolist() == list(range(end, end + MORE))
        assert store.read(TOPIC, 0, start_offset=end)["value"].to_pylist() == numbers(end, end + MORE)
    with Store.open(data_dir) as store:
        assert store.read(TOPIC, 0)["value"].to_pylist() == numbers(0, end + MORE)
    return end


@pytest.mark.parametrize("seed", range(20))
def test_acknowledged_appends_survive_a_kill_at_a_random_moment(tmp_path: Path, seed: int) -> None:
    data_dir = tmp_path / "data"
    create_topic(data_dir, TINY_FLUSHED if seed % 2 == 0 else TINY_UNFLUSHED)
    with Child("appender.py", data_dir, TOPIC, seed) as appender:
        first = appender.read_line()
        assert first is not None, f"the appender died before its first append: {appender.finish()[2]}"
        time.sleep(random.Random(seed).uniform(0.05, 0.4))
        appender.kill()
        returncode, lines, stderr = appender.finish()
    assert returncode == KILLED, stderr
    # A kill inside an atomic write may leave its temporary file; test_a_crash_at_each_point checks they go.
    check_after_crash(data_dir, seed=seed, acknowledged=acknowledged_through([first, *lines]),
                      temporary_files_allowed=True)


CRASH_POINTS = [
    "segment.torn_write:5",
    "segment.torn_write:1",
    "segment.after_write:5",
    "segment.seal_before_fsync:3",
    "roll.after_create:3",
    "flush.before_checkpoint:5",
    "atomic_write.before_rename:5",
]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_a_crash_at_each_point_keeps_every_acknowledged_append(tmp_path: Path, crash_at: str) -> None:
    data_dir = tmp_path / "data"
    create_topic(data_dir, TINY_FLUSHED)
    seed = CRASH_POINTS.index(crash_at)
    with Child("appender.py", data_dir, TOPIC, seed, "--max-appends", 200, crash_at=crash_at) as appender:
        returncode, lines, stderr = appender.finish()
    assert returncode == KILLED, f"{crash_at} never fired or the appender failed otherwise: {stderr}"
    assert lines or crash_at.endswith(":1"), f"{crash_at} fired before the first acknowledgement, not mid-run"
    check_after_crash(data_dir, seed=seed, acknowledged=acknowledged_through(lines), temporary_files_allowed=False)
