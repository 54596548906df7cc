"""LedgerWriter syncs what it has written on a thread of its own as it goes (write-behind): the ledger it finishes
reads back whole, and the descriptor is closed, on finish as on abort, only after every sync of it has ended."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage import ledger as ledger_module
from storage.ledger import Ledger, LedgerWriter
from storage.schema import HEADER_TYPE, STORED_SCHEMA

MESSAGES = 3_000


def stored_batch(first_offset: int, count: int) -> pa.RecordBatch:
    offsets = np.arange(first_offset, first_offset + count, dtype=np.int64)
    return pa.record_batch([
        pa.array(offsets),
        pa.array(offsets * 10),
        pa.array([b"key-%06d" % offset for offset in offsets.tolist()], pa.binary()),
        pa.array([bytes([offset % 251]) * 500 for offset in offsets.tolist()], pa.binary()),
        pa.nulls(count, HEADER_TYPE),
    ], schema=STORED_SCHEMA)


@pytest.fixture
def small_write_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync after every 64 KiB, so a ledger of 1.5 MB starts many of them."""
    monkeypatch.setattr(ledger_module, "WRITE_BEHIND_BYTES", 64 * 1024)


Events = list[tuple[str, int]]


@pytest.fixture
def slow_syncs(monkeypatch: pytest.MonkeyPatch) -> Events:
    """Each fdatasync takes 20 ms longer; every sync's start and end and every close are recorded, in order."""
    events: Events = []
    real_sync: Callable[[int], None] = os.fdatasync
    real_close: Callable[[int], None] = os.close

    def sync(fd: int) -> None:
        events.append(("sync", fd))
        time.sleep(0.02)
        real_sync(fd)
        events.append(("synced", fd))

    def close(fd: int) -> None:
        events.append(("close", fd))
        real_close(fd)

    monkeypatch.setattr(os, "fdatasync", sync)
    monkeypatch.setattr(os, "close", close)
    return events


def closed_after_its_syncs(events: Events, fd: int) -> bool:
    """Whether ``fd`` was synced in the background at least once and closed once every sync had ended."""
    mine = [kind for kind, number in events if number == fd]
    return "sync" in mine and mine[-1] == "close" and mine.count("sync") == mine.count("synced")


def written(tmp_path: Path) -> LedgerWriter:
    """A writer that has appended MESSAGES messages, 100 at a time, and is not finished."""
    writer = LedgerWriter(tmp_path / "ledger", tmp_path / "keys", compression=None)
    for first in range(0, MESSAGES, 100):
        writer.append(stored_batch(first, 100))
    return writer


@pytest.mark.usefixtures("small_write_behind")
def test_a_ledger_written_with_write_behind_reads_back_whole(tmp_path: Path, slow_syncs: Events) -> None:
    writer = written(tmp_path)
    writer.finish()
    assert closed_after_its_syncs(slow_syncs, writer._fd)
    ledger = Ledger(tmp_path / "ledger", tmp_path / "keys")
    try:
        read = pa.Table.from_batches(list(ledger.read_batches()))
    finally:
        ledger.close()
    assert read.equals(pa.Table.from_batches([stored_batch(0, MESSAGES)]))


@pytest.mark.usefixtures("small_write_behind")
def test_a_ledger_aborted_while_syncing_is_removed(tmp_path: Path, slow_syncs: Events) -> None:
    writer = written(tmp_path)
    writer.abort()
    assert closed_after_its_syncs(slow_syncs, writer._fd)
    assert not (tmp_path / "ledger").exists() and not (tmp_path / "keys").exists()
