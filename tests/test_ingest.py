"""The ingest worker's recovery, in process: messages appended after the last checkpoint, the last append cut short
in one partition, and superseded messages removed by the in-place cleaner before the restart; the worker appends
exactly the missing ones, each partition in source order (DESIGN.md invariants 1 and 2)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ledgerview.service.config import SourceSection
from ledgerview.service.ingest import IngestWorker, read_sequences, with_partitions, with_sequence_headers
from ledgerview.service.sources import GeneratorSource
from readers import TableView
from storage import Store

DEADLINE_S = 60.0


def generator(limit: int) -> GeneratorSource:
    return GeneratorSource(SourceSection(name="ticks", type="generator", topic="users", batch_messages=20,
                                         keys=6, value_bytes=12, limit=limit))


def run_worker_until(data: Path, source: GeneratorSource, sequence: int) -> IngestWorker:
    worker = IngestWorker(source, data, interval_s=0.01, flush_interval_s=0.05, kind="generator")
    worker.start()
    deadline = time.monotonic() + DEADLINE_S
    while worker.stats.next_sequence < sequence and worker.stats.state != "failed":
        assert time.monotonic() < deadline, f"worker stuck at {worker.stats}"
        time.sleep(0.01)
    worker.stop()
    assert worker.stats.state == "stopped", worker.stats.last_error
    return worker


@pytest.mark.parametrize("cleaned", [False, True])
def test_recovery_appends_exactly_the_missing_messages(data_dir: Path, cleaned: bool) -> None:
    source = generator(limit=240)
    with Store.open(data_dir) as store:
        store.create_topic("users", partitions=2, config={"cleanup.policy": "compact", "segment.bytes": "1024",
                                                          "min.cleanable.dirty.ratio": "0.01"})
        position = source.initial_position()
        for _ in range(10):  # 200 messages appended as the worker appends them, never checkpointed
            batch = source.read(position)
            assert batch is not None
            first = int(position["seq"])
            store.append("users", with_partitions(with_sequence_headers(batch.messages, "ticks", first), 2, first))
            position = batch.next_position
        cut = source.read(position)
        assert cut is not None
        stamped = with_partitions(with_sequence_headers(cut.messages, "ticks", 200), 2, 200)
        store.append("users", stamped.filter(pa.compute.equal(stamped["partition"], 0)))  # died before partition 1
        if cleaned:
            for partition in range(2):
                store.roll("users", partition)
            assert store.clean("users"), "the cleaner removed superseded messages"

    worker = run_worker_until(data_dir, source, 240)
    assert worker.stats.recovered_messages == int((stamped["partition"].to_numpy() == 1).sum())

    with Store.open(data_dir) as store:
        found = read_sequences(store, "users", "ticks", None)
    for sequences in found.values():
        assert (np.diff(sequences) > 0).all()
    every = np.sort(np.concatenate(list(found.values())))
    assert len(every) == len(np.unique(every))
    if not cleaned:
        np.testing.assert_array_equal(every, np.arange(240))
    assert set(range(220, 240)) <= set(every.tolist()), "generated after the restart, never cleaned"
    with TableView(data_dir, "users") as view:
        assert dict(view.items()) == {f"key{k:06d}".encode(): f"n={234 + k}".ljust(12, ".").encode()
                                      for k in range(6)}


def test_a_clean_restart_appends_nothing_again(data_dir: Path) -> None:
    with Store.open(data_dir) as store:
        store.create_topic("users", partitions=3)
    run_worker_until(data_dir, generator(limit=100), 100)
    again = run_worker_until(data_dir, generator(limit=100), 100)
    assert again.stats.recovered_messages == 0 and again.stats.messages == 0
    with Store.open(data_dir) as store:
        assert sum(store.end_offset("users", p) for p in range(3)) == 100


def test_a_partition_the_source_lines_give_is_kept_and_the_others_chosen() -> None:
    """JSON lines may name their partition (as `produce --json` takes them); the worker keeps it, and chooses the
    partition of the lines that name none, rather than adding a second partition column."""
    messages = pa.table({"key": pa.array([b"a", None, b"a"], pa.binary()), "value": pa.array([b"1", b"2", b"3"]),
                         "partition": pa.array([3, None, None], pa.int32())})
    stamped = with_partitions(messages, 4, 10)
    assert stamped.column_names.count("partition") == 1
    assert stamped["partition"].to_pylist() == [3, 11 % 4, with_partitions(messages.drop_columns(["partition"]), 4,
                                                                            10)["partition"][2].as_py()]
