"""Compaction while another process appends (invariants 4, 5 and 8): every published ledger is exactly the
latest live message per key up to its horizon, and the raw log keeps every message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from compactor import Compactor
from storage import Store
from storage.compacted import CompactedLedgers
from storage.schema import STORED_SCHEMA
from tests.processes.keyed_appender import message_at

SCRIPT = Path(__file__).parent / "processes" / "keyed_appender.py"
CALLS, SIZE = 400, 50


def expected_ledger(horizon: int) -> list[tuple[int, bytes, bytes | None]]:
    latest: dict[bytes, int] = {}
    for offset in range(horizon + 1):
        latest[message_at(offset)[0]] = offset
    return sorted((offset, *message_at(offset)) for offset in latest.values() if message_at(offset)[1] is not None)


def ledger_now(store: Store) -> tuple[int, list[tuple[int, bytes, bytes | None]]]:
    opened = CompactedLedgers(store.partition_log("t", 0).folder).open_current()
    assert opened is not None
    cursor, ledger = opened
    try:
        table = pa.Table.from_batches(list(ledger.read_batches()), schema=STORED_SCHEMA)
    finally:
        ledger.close()
    return cursor.horizon, [(r["offset"], r["key"], r["value"]) for r in table.to_pylist()]


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_compacting_while_another_process_appends(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.create_topic("t", config={"segment.bytes": "16384"})
        writer = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path), "t", str(CALLS), str(SIZE)])
        horizons = []
        try:
            compactor = Compactor(store)
            while writer.poll() is None:
                if compactor.compact("t")[0].skipped:
                    continue
                horizon, rows = ledger_now(store)
                assert rows == expected_ledger(horizon)
                horizons.append(horizon)
        finally:
            writer.wait(timeout=120)
        assert writer.returncode == 0
        compactor.compact("t")
        horizon, rows = ledger_now(store)
        assert horizon == CALLS * SIZE - 1 and rows == expected_ledger(horizon)
        assert store.read("t", 0)["offset"].to_pylist() == list(range(CALLS * SIZE))
    assert len(horizons) >= 2 and horizons == sorted(horizons)
