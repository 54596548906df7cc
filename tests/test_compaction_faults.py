"""kill -9 of a compacting process at each step of both phases and around the publish (invariants 3, 4 and 5):
afterwards the compacted view is exactly the old one or the new one, never a mix, the raw log is untouched, and
the next run leaves no orphan ledger."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from compactor import CompactionState, Compactor
from storage import Store
from storage.compacted import CompactedLedgers
from storage.files import parse_ledger_file
from storage.schema import STORED_SCHEMA

SCRIPT = Path(__file__).parent / "processes" / "compact.py"
CONFIG = {"segment.bytes": "65536", "compaction.memory.bytes": "65536"}  # a small budget: several passes and writes


Pair = tuple[bytes, bytes | None]
Row = tuple[int, bytes | None, bytes | None]


def changelog(start: int, count: int) -> list[Pair]:
    return [(f"k{i % 1500}".encode(), None if i % 17 == 0 else f"v{i}".encode() * 20)
            for i in range(start, start + count)]


def compacted_view(store: Store) -> tuple[int, list[Row]]:
    """The horizon and the compacted view of partition 0: the ledger, then the raw log above the horizon."""
    opened = CompactedLedgers(store.partition_log("t", 0).folder).open_current()
    assert opened is not None
    cursor, ledger = opened
    try:
        head = pa.Table.from_batches(list(ledger.read_batches()), schema=STORED_SCHEMA)
    finally:
        ledger.close()
    tail = store.read("t", 0, start_offset=cursor.horizon + 1)
    rows = [(r["offset"], r["key"], r["value"]) for r in head.to_pylist() + tail.to_pylist()]
    return cursor.horizon, rows


def expected_view(messages: list[Pair], horizon: int) -> list[Row]:
    latest = {key: offset for offset, (key, _) in enumerate(messages[: horizon + 1])}
    head = sorted(offset for offset in latest.values() if messages[offset][1] is not None)
    return [(o, *messages[o]) for o in head] + [(o, *messages[o]) for o in range(horizon + 1, len(messages))]


@pytest.mark.fault
@pytest.mark.parametrize(
    "point",
    ["compactor.after_phase_one", "compactor.phase_two_write:2", "compactor.before_publish",
     "atomic_write.before_rename:2", "compacted.publish_before_retire"],
)
@pytest.mark.parametrize("layers", ["1", "4"], ids=["whole", "layered"])
def test_a_killed_compaction_leaves_the_old_or_the_new_view_and_no_orphan(tmp_path: Path, point: str,
                                                                         layers: str) -> None:
    """The killed run is the second: it rewrites the view whole, or (layered) writes a ledger over the first."""
    messages = changelog(0, 4000)
    with Store.open(tmp_path) as store:
        store.create_topic("t", config={**CONFIG, "compaction.max.layers": layers})
        store.append("t", messages, partition=0)
        Compactor(store).compact("t")
        more = changelog(4000, 3000)
        store.append("t", more, partition=0)
        messages += more
        raw_before = store.read("t", 0)
    child = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "t"], capture_output=True, timeout=120,
                           env={**os.environ, "LEDGERVIEW_CRASH_AT": point})
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    with Store.open(tmp_path) as store:
        assert store.read("t", 0).equals(raw_before)  # the raw log is never written by compaction
        horizon, view = compacted_view(store)
        assert horizon in (3999, len(messages) - 1)
        assert view == expected_view(messages, horizon)
        assert Compactor(store).status("t")[0].state is CompactionState.ERROR
        Compactor(store).compact("t")
        horizon, view = compacted_view(store)
        assert horizon == len(messages) - 1 and view == expected_view(messages, horizon)
        ledgers = CompactedLedgers(store.partition_log("t", 0).folder)
        cursor = ledgers.read_cursor()
        assert cursor is not None
        live = {parse_ledger_file(p.name) for p in ledgers.folder.iterdir() if parse_ledger_file(p.name)}
        assert len(cursor.ledger_ids) == (1 if layers == "1" else 2)
        assert {(ledger_id, suffix) for ledger_id, suffix, temp in live if temp is None} == {
            *((ledger_id, suffix) for ledger_id in cursor.ledger_ids for suffix in (".ledger", ".keys")),
            (cursor.ledger_id, ".layers")}
