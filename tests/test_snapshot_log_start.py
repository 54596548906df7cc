"""A snapshot read whose log start moves between reading it and reading the messages (retention or
delete-records in another thread or process, at exactly that moment)."""

from __future__ import annotations

import pytest

from readers.snapshot import snapshot_batches
from storage import Store


def test_a_snapshot_whose_log_start_moves_before_it_reads_folds_from_the_new_start(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.create_topic("t")
    store.append("t", [(b"a", b"a0"), (b"b", b"b0"), (b"c", b"c0")], partition=0)
    store.append("t", [(b"a", b"a1"), (b"d", b"d0")], partition=0)
    real_start_offset = store.start_offset
    moved: list[int] = []

    def start_then_delete_records(topic: str, partition: int) -> int:
        start = real_start_offset(topic, partition)
        if not moved:
            moved.append(store.delete_records(topic, partition, 3).log_start_offset)  # lands after the start was read
        return start

    monkeypatch.setattr(store, "start_offset", start_then_delete_records)
    rows = {(row["key"], row["value"]) for batch in snapshot_batches(store, "t", 0, store.end_offset("t", 0))
            for row in batch.to_pylist()}
    assert moved == [3] and rows == {(b"a", b"a1"), (b"d", b"d0")}

