"""kill -9 of a cleaning process at each step of the in-place swap (invariants 2 and 6): a reader that does not
hold the writer lock sees the old or the cleaned log, never a mix; reopening rolls the swap back or forward and
leaves no ``.cleaned``, ``.swap`` or ``.deleted`` file; the next pass finishes the cleaning."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage import Store
from storage.files import WRITER_LOCK, parse_segment_file, partition_folder
from tests.processes.children import Child

SCRIPT = Path(__file__).parent / "processes" / "clean.py"
NOW_MS = 1_700_000_000_000
CONFIG = {"cleanup.policy": "compact", "segment.bytes": "1048576", "index.interval.bytes": "256"}
SEGMENTS = 3
"""Sealed segments, all in one group: the swap renames 3 old segments."""
Row = tuple[int, bytes | None, bytes | None]

CRASH_POINTS = [
    ("segment.after_write:1", "old"),  # writing the .cleaned segment
    ("swap.after_cleaned", "old"),  # sealed and fsynced, not yet committed
    ("segment.before_log_rename:1", "old"),  # its indexes renamed .swap, its log still .cleaned
    ("swap.after_swap", "new"),  # committed: the log is .swap, the old segments untouched
    ("swap.after_delete:2", "new"),  # two old segments renamed .deleted, one left
    (f"segment.before_log_rename:{SEGMENTS + 2}", "new"),  # the .swap indexes renamed, the log not yet
]


def rows(store: Store) -> list[Row]:
    table = store.read("t", 0)
    return list(zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def cleaned(old: list[Row], end: int) -> list[Row]:
    """Below ``end``, each key's latest message (tombstones stay on their first pass); above, everything."""
    latest = {key: offset for offset, key, _ in old if offset < end}
    return [row for row in old if row[0] >= end or latest[row[1]] == row[0]]


def temporary_files(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if (parsed := parse_segment_file(name)) and parsed[2])


@pytest.mark.fault
@pytest.mark.parametrize(("point", "outcome"), CRASH_POINTS, ids=[point for point, _ in CRASH_POINTS])
def test_a_killed_swap_leaves_the_old_or_the_cleaned_log(tmp_path: Path, point: str, outcome: str) -> None:
    with Store.open(tmp_path, clock=lambda: NOW_MS) as store:
        store.create_topic("t", config=CONFIG)
        for segment in range(SEGMENTS):
            store.append("t", [(f"k{i % 7}".encode(), None if i % 10 == 9 else f"v{segment}-{i}".encode() * 8)
                               for i in range(40)], partition=0)
            store.roll("t", 0)
        store.append("t", [(b"k1", b"in the active segment")], partition=0)
        old = rows(store)
    end = SEGMENTS * 40
    expected = {"old": old, "new": cleaned(old, end)}[outcome]
    child = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "t", str(NOW_MS)], capture_output=True,
                           timeout=120, env={**os.environ, "LEDGERVIEW_CRASH_AT": point})
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    folder = partition_folder(tmp_path, "t", 0)
    with Child("holder.py", folder / WRITER_LOCK) as holder:  # as if another writer were busy: no recovery
        holder.expect_line("locked")
        with Store.open(tmp_path, lock_wait=False) as reader:
            assert rows(reader) == expected
        holder.send_line("release")
        assert holder.finish()[0] == 0
    with Store.open(tmp_path, clock=lambda: NOW_MS) as store:
        assert rows(store) == expected
        assert temporary_files(folder) == []
        assert store.end_offset("t", 0) == end + 1
        store.clean("t")
        assert rows(store) == cleaned(old, end)
