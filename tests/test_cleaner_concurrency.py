"""Cleaning while another process appends (invariants 2 and 8): after every pass the raw log is each key's latest
message below the pass's end offset and every message from there on, the appender never loses a message, and
the end offset only grows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage import Store
from tests.processes.keyed_appender import message_at

SCRIPT = Path(__file__).parent / "processes" / "keyed_appender.py"
CALLS, SIZE = 400, 50
CONFIG = {"cleanup.policy": "compact,delete", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0"}
"""Small segments so the appender rolls often; ratio 0 so every pass with dirty bytes runs; delete.retention.ms
keeps its default (a day), so the appender's tombstones stay."""


def expected(cleaned_below: int, end: int) -> list[tuple[int, bytes, bytes | None]]:
    latest = {message_at(offset)[0]: offset for offset in range(cleaned_below)}
    return [(offset, *message_at(offset)) for offset in range(end)
            if offset >= cleaned_below or latest[message_at(offset)[0]] == offset]


@pytest.mark.slow
def test_cleaning_while_another_process_appends(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.create_topic("t", config=CONFIG)
        writer = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path), "t", str(CALLS), str(SIZE)])
        ends = []
        try:
            while writer.poll() is None:
                for stats in store.clean("t"):
                    end = store.end_offset("t", 0)
                    table = store.read("t", 0, end_offset=end)
                    rows = list(zip(table["offset"].to_pylist(), table["key"].to_pylist(),
                                    table["value"].to_pylist(), strict=True))
                    assert rows == expected(stats.end_offset, end)
                    ends.append(stats.end_offset)
        finally:
            writer.wait(timeout=120)
        assert writer.returncode == 0
        assert store.end_offset("t", 0) == CALLS * SIZE
        store.roll("t", 0)
        [final] = store.clean("t")
        assert final.end_offset == CALLS * SIZE
        table = store.read("t", 0)
        assert table["offset"].to_pylist() == [offset for offset, _, _ in expected(CALLS * SIZE, CALLS * SIZE)]
    assert len(ends) >= 2 and ends == sorted(ends)
