"""A read-only store (Store.open(..., read_only=True)), as Spark's read tasks open a data folder: it reads what
writers left without taking a writer lock, creating a file or recovering anything, and refuses every change."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import Store
from storage.errors import LedgerviewError, ReadOnlyStoreError
from streaming.scan import ScanOptions, TopicScan

CONFIG = {"segment.bytes": "2048", "index.interval.bytes": "256"}


def files(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*"))
            if path.is_file()}


def torn_after(data_dir: Path, partitions: int, messages: int) -> Path:
    """A topic ``t`` whose partition 0 holds ``messages`` messages and then the torn bytes a writer killed
    mid-append leaves (its next open, not a reader, cuts them); the active segment's path."""
    with Store.open(data_dir) as writer:
        writer.create_topic("t", partitions, CONFIG)
        writer.append("t", [(f"k{i}", f"v{i}") for i in range(messages)], partition=0)
        active = writer.partition_log("t", 0).active.log_path
    with open(active, "ab") as torn:
        torn.write(b"\x00" * 30)
    return active


def test_a_read_only_open_creates_nothing_and_refuses_every_change(data_dir: Path) -> None:
    with pytest.raises(LedgerviewError, match="No ledgerview data folder"):
        Store.open(data_dir, read_only=True)
    assert not data_dir.exists()
    with Store.open(data_dir) as writer:
        writer.create_topic("t", 2, CONFIG)
        writer.append("t", [(f"k{i}", f"v{i}") for i in range(100)], partition=0)
    before = files(data_dir)
    with Store.open(data_dir, read_only=True) as reader:
        assert reader.read("t", 0, 0).num_rows == 100
        assert reader.read("t", 1, 0).num_rows == 0  # never written: read as empty, not created
        for change in (lambda: reader.append("t", [("k", "v")], partition=0), lambda: reader.roll("t", 0),
                       lambda: reader.create_topic("u"), lambda: reader.enforce_retention("t")):
            with pytest.raises(ReadOnlyStoreError, match="opened read-only"):
                change()
    assert files(data_dir) == before


def test_a_read_only_store_leaves_a_torn_tail_to_the_writer_and_follows_its_appends(data_dir: Path) -> None:
    active = torn_after(data_dir, 1, 50)
    size = active.stat().st_size
    with Store.open(data_dir, read_only=True) as reader:
        assert reader.read("t", 0, 0).num_rows == 50  # up to the last complete batch
        assert active.stat().st_size == size  # not cut: only a writer recovers
        with Store.open(data_dir) as writer:
            writer.append("t", [(f"k{i}", f"v{i}") for i in range(50, 80)], partition=0)
        assert reader.read("t", 0, 0).column("offset").to_pylist() == list(range(80))


def test_a_spark_read_recovers_nothing_and_leaves_no_file_behind(data_dir: Path) -> None:
    torn_after(data_dir, 2, 200)
    before = files(data_dir)
    scan = TopicScan(ScanOptions.parse({"path": str(data_dir), "topic": "t", "view": "raw",
                                        "maxPartitionBytes": "4096"}))
    offsets = [row["offset"] for piece in scan.partitions() for batch in scan.read(piece)
               for row in batch.to_pylist()]
    assert offsets == list(range(200))
    assert files(data_dir) == before  # no recovery, no lock file, no segment for the unwritten partition 1
