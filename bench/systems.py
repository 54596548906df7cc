"""The systems under test: ledgerview's store and the plain-file floors (Arrow IPC, Parquet) with pyarrow.

A writer puts a whole dataset at ``target`` (a folder for the store, a file for the peers) and leaves it as
durable as the store's ``flush()`` does: data fsynced, and for the peers the folder too. A reader reads all of
``target`` back as Arrow and returns how many messages it saw.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from storage import Store

Writer = Callable[[pa.Table, Path], None]
Reader = Callable[[Path], int]

TOPIC = "bench"
APPEND_ROWS = 10_000
"""Rows per append call, and per record batch in the IPC peer."""
ROW_GROUP_ROWS = 1_000_000


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ledgerview_write(table: pa.Table, target: Path) -> None:
    """A fresh store, one topic of one partition with the default config, appends of APPEND_ROWS rows, flush."""
    write_topic(table, target, {})


def ledgerview_writer(compression_type: str) -> Writer:
    """``ledgerview_write`` into a topic whose compression.type is ``compression_type``."""

    def write(table: pa.Table, target: Path) -> None:
        write_topic(table, target, {"compression.type": compression_type})

    return write


def write_topic(table: pa.Table, target: Path, config: dict[str, str]) -> None:
    with Store.open(target) as store:
        store.create_topic(TOPIC, partitions=1, config=config)
        for start in range(0, table.num_rows, APPEND_ROWS):
            store.append(TOPIC, table.slice(start, APPEND_ROWS), partition=0)
        store.flush()


def bytes_on_disk(target: Path) -> int:
    """Bytes of a file, or of every file under a folder (a store: segments, indexes, checkpoints, metadata)."""
    if target.is_file():
        return target.stat().st_size
    return sum(path.stat().st_size for path in target.rglob("*") if path.is_file())


def ipc_write(table: pa.Table, target: Path) -> None:
    """An Arrow IPC file of APPEND_ROWS-row record batches, fsynced."""
    with pa.OSFile(str(target), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for start in range(0, table.num_rows, APPEND_ROWS):
            writer.write_table(table.slice(start, APPEND_ROWS))
    fsync_path(target)
    fsync_path(target.parent)


def parquet_write(table: pa.Table, target: Path) -> None:
    """A Parquet file with pyarrow's defaults (snappy, dictionary encoding) and ROW_GROUP_ROWS-row groups, fsynced."""
    with pq.ParquetWriter(str(target), table.schema) as writer:
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    fsync_path(target)
    fsync_path(target.parent)


def ledgerview_read(target: Path) -> int:
    with Store.open(target) as store:
        return int(store.read(TOPIC, 0).num_rows)


def ledgerview_read_unverified(target: Path) -> int:
    """The same read without the CRC-32C check of every batch: what reading costs beside checksumming."""
    with Store.open(target, verify_reads=False) as store:
        return int(store.read(TOPIC, 0).num_rows)


def ledgerview_read_batches(target: Path) -> int:
    with Store.open(target) as store:
        return sum(int(batch.num_rows) for batch in store.read_batches(TOPIC, 0))


def ipc_read(target: Path) -> int:
    return int(pa.ipc.open_file(pa.memory_map(str(target))).read_all().num_rows)


def parquet_read(target: Path) -> int:
    return int(pq.read_table(str(target)).num_rows)
