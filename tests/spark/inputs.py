"""Inputs for the Spark tests: tables written as Parquet files that a file stream reads one per micro-batch
(``maxFilesPerTrigger=1``), so a batch id always covers the same rows, as exactly-once needs of its source."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from storage import Store

FIRST_MTIME_S = 1_700_000_000


def write_input_files(folder: Path, table: pa.Table, files: int, *, first: int = 0) -> Path:
    """``table`` split into ``files`` Parquet files in order, numbered from ``first``."""
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-table.num_rows // files)
    for index in range(files):
        path = folder / f"part-{first + index:05d}.parquet"
        pq.write_table(table.slice(index * size, size), path)
        ordered_mtime(path, first + index)
    return folder


def ordered_mtime(path: Path, index: int) -> None:
    """Spark's file source takes files in modification-time order: files written within one clock tick would
    come in any order, and the latest value of a key with them."""
    moment = FIRST_MTIME_S + index
    os.utime(path, (moment, moment))


def numbered_rows(count: int, *, start: int = 0, keys: int = 50) -> pa.Table:
    """Rows whose values are unique (``n<i>``), so duplicates and losses show; keys repeat."""
    numbers = range(start, start + count)
    return pa.table({"key": [f"k{i % keys:03d}" for i in numbers], "value": [f"n{i}" for i in numbers]})


def stored_values(store: Store, topic: str) -> list[str]:
    """Every value in the topic's raw log, sorted."""
    partitions = store.topic_metadata(topic).partitions
    values = [value for p in range(partitions) for value in store.read(topic, p).column("value").to_pylist()]
    return sorted(value.decode() for value in values)
