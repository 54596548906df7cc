"""The compaction workloads' systems: ledgerview's two-phase compactor, and what a user would run instead to keep
the latest live message per key of a changelog (DuckDB, Polars, pyarrow, Spark SQL), plus the floor of one
memory-mapped scan of the raw log.

A case here is a preparer and a job. The preparer runs untimed, in a process of its own, and leaves the input on
disk at ``target``; the job is timed and ends with the deduplicated result durable on disk:

- ledgerview: the preparer appends the dataset to a fresh store in 10,000-message appends (or 100-message ones,
  about a Kafka producer's batch at its default batch.size of 16 KiB) and flushes it (the same layout as the
  ``append`` workload); the job opens the store, runs ``Compactor(store).compact(topic)`` (the
  ledger, its key index and the cursor are fsynced by the compactor) and closes the store.
- peers: the preparer writes the dataset with an ``offset`` column (the row number, as the log's offsets are) as
  an Arrow IPC file of 1,000,000-row batches, or a Parquet file for Spark; the job reads it, keeps each key's
  latest message unless it is a tombstone, in offset order (as the ledger is), writes the rows with every column
  to ``output`` (an uncompressed Arrow IPC file, a folder of uncompressed Parquet files for Spark) and fsyncs it.

Tombstones are dropped after the latest message of each key is chosen, never before (that would resurrect older
values of deleted keys).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import importlib
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench.systems import APPEND_ROWS, TOPIC, fsync_path
from compactor import Compactor
from ledgerview import changelog
from ledgerview.changelog import ChangelogSpec
from storage import Store
from storage.binary_arrays import value_offsets
from storage.compacted import CompactedLedgers
from storage.files import LOG_SUFFIX, key_index_folder, ledgers_folder, parse_segment_file, partition_folder
from storage.ledger import Ledger, LedgerReads

MiB = 2**20
INPUT_BATCH_ROWS = 1_000_000
"""Rows per record batch of the peers' Arrow IPC input (the dataset cache's chunk size)."""
NEW_MESSAGES_SHARE = 0.1
"""What the incremental workload appends after the first compaction, as a share of the dataset."""
GETS = 100_000
GET_SEED = 13


@dataclass(frozen=True)
class Outcome:
    """What a job reports beyond its time (the harness measures the time and memory)."""

    messages: int | None
    """Messages the job read; None: the dataset's."""
    kept: int | None = None
    """Messages in the result; None: counted by the harness from ``output`` after the timed region."""
    passes: int | None = None
    output_bytes: int | None = None
    """Bytes of the result on disk (ledgerview: the ledger file); None: measured from ``output``."""
    index_bytes: int | None = None
    """Bytes of ledgerview's key index folder."""
    seconds: float | None = None
    """The job's own timing of its measured part, when the whole call includes set-up that is not measured (the
    ``get`` job times each lookup and reports their sum)."""
    notes: str = ""


Preparer = Callable[[pa.Table, ChangelogSpec, Path], None]
"""(dataset, its spec, target): leave the job's input at ``target``, untimed."""
Job = Callable[[Path, Path], Outcome]
"""(target, output): the timed work."""


# ------------------------------------------------------------------------------------------------- preparers
def ledgerview_store(config: Mapping[str, Any] | None = None, *, compact: bool = False,
                     new_messages: bool = False, compact_again: bool = False,
                     append_messages: int = APPEND_ROWS) -> Preparer:
    """A store with one 1-partition topic holding the dataset (``config``: topic overrides), appended
    ``append_messages`` at a time (each append is one stored batch).

    ``compact``: run a first compaction after the appends; ``new_messages``: then append NEW_MESSAGES_SHARE of
    the dataset's size of fresh messages (same keys and distribution, another seed) and flush;
    ``compact_again``: then compact again (a layered view, unless ``config`` sets compaction.max.layers to 1).
    """

    def prepare(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
        with Store.open(target) as store:
            store.create_topic(TOPIC, partitions=1, config=dict(config or {}))
            append_table(store, table, append_messages)
            if compact:
                Compactor(store).compact(TOPIC)
            if new_messages:
                append_table(store, changelog.generate(new_messages_spec(spec)))
            if compact_again:
                Compactor(store).compact(TOPIC)

    return prepare


def append_table(store: Store, table: pa.Table, messages: int = APPEND_ROWS) -> None:
    """``table`` appended to partition 0 of TOPIC ``messages`` at a time (by default the ``append`` workload's
    layout), flushed."""
    for start in range(0, table.num_rows, messages):
        store.append(TOPIC, table.slice(start, messages), partition=0)
    store.flush()


def new_messages_spec(spec: ChangelogSpec) -> ChangelogSpec:
    """The incremental workload's new messages: same keys, distribution and tombstones, a fresh seed, later
    timestamps."""
    return dataclasses.replace(spec, messages=max(1, round(spec.messages * NEW_MESSAGES_SHARE)), seed=spec.seed + 1,
                               start_timestamp_ms=spec.start_timestamp_ms + spec.messages)


def _with_offsets(table: pa.Table) -> pa.Table:
    return table.add_column(0, "offset", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def ipc_input(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """The peers' input: an Arrow IPC file (uncompressed) with an ``offset`` column."""
    with pa.OSFile(str(target), "wb") as sink:
        table = _with_offsets(table)
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=INPUT_BATCH_ROWS)


def parquet_input(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """Spark's input: a Parquet file with pyarrow's defaults (snappy, dictionary encoding) and an ``offset``
    column."""
    pq.write_table(_with_offsets(table), str(target), row_group_size=INPUT_BATCH_ROWS)


# ------------------------------------------------------------------------------------------ ledgerview jobs
def _partition_folder(target: Path) -> Path:
    return partition_folder(target, TOPIC, 0)


def folder_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def ledgerview_compact(target: Path, output: Path) -> Outcome:
    """Store.open, Compactor(store).compact(topic), close. The result is the ledger and its key index."""
    with Store.open(target) as store:
        [result] = Compactor(store).compact(TOPIC)
    assert result.ledger_id is not None and not result.skipped, result
    index = folder_bytes(key_index_folder(_partition_folder(target), result.ledger_id))
    return Outcome(result.messages_read, result.messages_kept, result.passes, result.ledger_bytes, index)


def ledgerview_open(target: Path, output: Path) -> Outcome:
    """Store.open and the partition's log opened for writing, which recovers it from its recovery point, then
    close."""
    with Store.open(target) as store:
        end = store.partition_log(TOPIC, 0).end_offset
    return Outcome(end)


def compacted_state(target: Path) -> Path | None:
    """The folder a ledgerview job changes (the partition's compacted ledgers and cursor), None for a peer's
    input: the harness saves it before the timed repetitions and puts it back between them."""
    folder = _partition_folder(target)
    return ledgers_folder(folder) if folder.is_dir() else None


def mmap_scan(target: Path, output: Path) -> Outcome:
    """The floor: memory-map each raw segment file and sum it as 64-bit words, which touches every byte once."""
    total = 0
    segments = sorted(path for path in _partition_folder(target).iterdir()
                      if (parsed := parse_segment_file(path.name)) and parsed[1:] == (LOG_SUFFIX, None))
    for path in segments:
        total += sum_mapped(path)
    return Outcome(None, notes=f"{len(segments)} segment files, checksum {total % 1000:03d}")


def sum_mapped(path: Path) -> int:
    """Memory-map a file and sum it as 64-bit words (wrapping), which touches every byte once."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            return 0
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            data = np.frombuffer(mapped, dtype=np.uint8)
            words = size // 8
            total = int(data[: words * 8].view(np.uint64).sum(dtype=np.uint64))  # wraps mod 2**64
            total += int(data[words * 8 :].sum(dtype=np.uint64))
            del data
    return total


def _open_ledger(target: Path) -> LedgerReads:
    opened = CompactedLedgers(_partition_folder(target)).open_current()
    assert opened is not None, f"no compacted ledger in {target}"
    return opened[1]


def scan_compacted(target: Path) -> int:
    """A reader: the current ledger through storage.compacted, every batch decoded (CRC-32C verified)."""
    ledger = _open_ledger(target)
    try:
        return sum(int(batch.num_rows) for batch in ledger.read_batches())
    finally:
        ledger.close()


def _table_view_class() -> Any:
    try:
        return getattr(importlib.import_module("readers"), "TableView", None)
    except ImportError:
        return None


GET_PATHS = {"table view": GETS, "ledger lookup": GETS // 5, "key index": GETS}
"""What a ``get`` job goes through, and how many lookups: readers.TableView(path, topic).get(key) (falls back to
the ledger lookup while readers has no TableView); Ledger.lookup(key) on the opened ledger, the value taken out as
bytes (fewer lookups: it is there to split TableView's time, and each one costs milliseconds); only the key
index's locate(key) (one RocksDB get), the floor of a lookup."""


def get_job(path: str) -> Job:
    """Point lookups (GET_PATHS[path] of them) of random existing keys of the compacted view, each timed, through
    ``path``; the seconds reported are the sum of the lookups' latencies."""
    if path not in GET_PATHS:
        raise ValueError(f"get path {path!r}; allowed: {', '.join(GET_PATHS)}")

    def job(target: Path, output: Path) -> Outcome:
        ledger = _open_ledger(target)
        view = None
        try:
            keys = pa.chunked_array([batch.column(2) for batch in ledger.read_batches()], pa.binary())
            rows = np.random.default_rng(GET_SEED).integers(0, len(keys), GET_PATHS[path])
            chosen = keys.take(pa.array(rows)).to_pylist()
            del keys
            table_view = _table_view_class() if path == "table view" else None
            lookup: Callable[[bytes], object]
            if table_view is not None:
                view = table_view(target, TOPIC)
                lookup, how = view.get, "readers.TableView(path, topic).get(key)"
            elif path == "key index":
                assert isinstance(ledger, Ledger), "the key-index path reads a view of one ledger"
                lookup, how = ledger.keys.locate, "ledger.keys.locate(key)"
            else:
                def lookup(key: bytes) -> object:
                    found = ledger.lookup(key)
                    return None if found is None else found.column(3)[0].as_py()

                how = "ledger.lookup(key), value as bytes"
                if path == "table view":
                    how = "readers has no TableView yet: " + how
            latencies = np.empty(len(chosen), dtype=np.int64)
            clock = time.perf_counter_ns
            missing = 0
            for i, key in enumerate(chosen):
                start = clock()
                value = lookup(key)
                latencies[i] = clock() - start
                missing += value is None
        finally:
            if view is not None and hasattr(view, "close"):
                view.close()
            ledger.close()
        p50, p99, p999 = np.percentile(latencies, [50, 99, 99.9]) / 1000
        notes = f"{len(chosen):,} gets: p50 {p50:,.1f} µs, p99 {p99:,.1f} µs, p99.9 {p999:,.1f} µs; {how}"
        if missing:
            notes += f"; {missing:,} existing keys NOT FOUND"
        return Outcome(len(chosen), seconds=float(latencies.sum()) / 1e9, notes=notes)

    return job


# ------------------------------------------------------------------------------------------------ peer jobs
def _fsync_output(output: Path) -> None:
    for path in [output, *output.rglob("*")] if output.is_dir() else [output]:
        fsync_path(path)
    fsync_path(output.parent)


def _write_ipc(reader: pa.RecordBatchReader, output: Path) -> None:
    with pa.OSFile(str(output), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)


DUCKDB_SEMI_JOIN = """
SELECT * FROM src
WHERE "offset" IN (SELECT max("offset") FROM src GROUP BY key) AND value IS NOT NULL
ORDER BY "offset"
"""
DUCKDB_QUALIFY = """
SELECT * FROM (
    SELECT * FROM src QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1
) WHERE value IS NOT NULL
ORDER BY "offset"
"""

DUCKDB_ARG_MAX = """
SELECT * FROM (
    SELECT max("offset") AS "offset", key, arg_max_null(value, "offset") AS value,
           arg_max(timestamp, "offset") AS timestamp
    FROM src GROUP BY key
) WHERE value IS NOT NULL
ORDER BY "offset"
"""


def duckdb_job(query: str) -> Job:
    """DuckDB (default settings: all cores) over the IPC file as a pyarrow dataset, its result streamed to an
    Arrow IPC file."""

    def job(target: Path, output: Path) -> Outcome:
        import duckdb

        with duckdb.connect() as connection:
            connection.register("src", ds.dataset(str(target), format="ipc"))
            _write_ipc(connection.sql(query).to_arrow_reader(INPUT_BATCH_ROWS), output)
        _fsync_output(output)
        return Outcome(None)

    return job


def polars_job(target: Path, output: Path) -> Outcome:
    import polars as pl

    (pl.scan_ipc(target)
     .unique(subset="key", keep="last", maintain_order=True)
     .filter(pl.col("value").is_not_null())
     .sink_ipc(output, compression="uncompressed"))
    _fsync_output(output)
    return Outcome(None)


def pyarrow_job(target: Path, output: Path) -> Outcome:
    """group_by(key) max(offset) over the memory-mapped file, then its rows taken and written
    (``pyarrow_write_latest``)."""
    reader = pa.ipc.open_file(pa.memory_map(str(target)))
    pyarrow_write_latest(reader, pyarrow_latest_offsets(reader), output)
    return Outcome(None)


def pyarrow_latest_offsets(reader: pa.ipc.RecordBatchFileReader) -> np.ndarray:
    """Each key's latest offset, sorted: Arrow's hash aggregation over the whole file's keys and offsets."""
    latest = reader.read_all().select(["key", "offset"]).group_by("key").aggregate([("offset", "max")])
    return np.sort(latest.column("offset_max").to_numpy())


def pyarrow_write_latest(reader: pa.ipc.RecordBatchFileReader, offsets: np.ndarray, output: Path) -> None:
    """Batch by batch, take the rows at ``offsets`` (offset = row number, so the take is the join; a batch at a
    time, as one take over 30M rows would pass the 2 GiB a binary column holds), drop tombstones, write, fsync."""
    import pyarrow.compute as pc

    with pa.OSFile(str(output), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
        start = 0
        for index in range(reader.num_record_batches):
            batch = reader.get_batch(index)
            lower, upper = np.searchsorted(offsets, [start, start + batch.num_rows])
            kept = batch.take(pa.array(offsets[lower:upper] - start))
            writer.write_batch(kept.filter(pc.is_valid(kept.column("value"))))
            start += batch.num_rows
    _fsync_output(output)


SPARK_QUERY = """
SELECT `offset`, key, value, timestamp FROM (
    SELECT *, row_number() OVER (PARTITION BY key ORDER BY `offset` DESC) AS latest FROM src
) WHERE latest = 1 AND value IS NOT NULL
ORDER BY `offset`
"""
SPARK_DRIVER_MEMORY = "8g"
_spark: Any = None


def _spark_session() -> Any:
    """One local[2] session per process (its start, about 20 s, is in the untimed warm-up)."""
    global _spark
    if _spark is None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        warehouse = tempfile.mkdtemp(prefix="ledgerview-bench-spark-")
        atexit.register(shutil.rmtree, warehouse, True)

        _spark = (SparkSession.builder.master("local[2]").appName("ledgerview-bench")
                  .config("spark.driver.memory", SPARK_DRIVER_MEMORY)
                  .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                  .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                  .config("spark.sql.warehouse.dir", warehouse)
                  .getOrCreate())
        _spark.sparkContext.setLogLevel("ERROR")
    return _spark


def spark_job(target: Path, output: Path) -> Outcome:
    spark = _spark_session()
    spark.read.parquet(str(target)).createOrReplaceTempView("src")
    spark.sql(SPARK_QUERY).write.option("compression", "none").parquet(str(output))
    _fsync_output(output)
    return Outcome(None)


# ----------------------------------------------------------------------------------------------- the result
def output_figures(output: Path) -> tuple[int, int]:
    """(messages, bytes) of a peer's result: an Arrow IPC file, or a folder of Parquet files."""
    if output.is_dir():
        files = [path for path in output.rglob("*.parquet")]
        return sum(pq.ParquetFile(path).metadata.num_rows for path in files), folder_bytes(output)
    with pa.memory_map(str(output)) as source:
        reader = pa.ipc.open_file(source)
        rows = sum(reader.get_record_batch(i).num_rows for i in range(reader.num_record_batches))
    return rows, output.stat().st_size


VIEW_COLUMNS = ("offset", "key", "value", "timestamp")


def view_digest(target: Path, output: Path) -> str | None:
    """The first 16 hex digits of a SHA-256 over a job's result in offset order: offsets, keys, values and
    timestamps (as int64), so that rows of different systems show at a glance whether they kept the same view.
    None when the job left no result (the mmap scan) or one of no view (the cleaning floor's copied segments)."""
    if output.is_dir():
        parts = sorted(output.rglob("*.parquet"))
        if not parts:
            return None
        table = pa.concat_tables(pq.read_table(path, columns=list(VIEW_COLUMNS)) for path in parts)
    elif output.exists():
        with pa.memory_map(str(output)) as source:
            table = pa.ipc.open_file(source).read_all().select(list(VIEW_COLUMNS))
    else:
        folder = _partition_folder(target)
        current = CompactedLedgers(folder).open_current() if folder.is_dir() else None
        if current is None:
            return None
        _, ledger = current
        try:
            table = pa.Table.from_batches(list(ledger.read_batches())).select(list(VIEW_COLUMNS))
        finally:
            ledger.close()
    table = pa.table({name: _plain(table.column(name)) for name in VIEW_COLUMNS}).sort_by("offset")
    digest = hashlib.sha256()
    for name in VIEW_COLUMNS:
        column = table.column(name).combine_chunks()
        if pa.types.is_binary(column.type):
            offsets = value_offsets(column)
            digest.update(np.diff(offsets).astype(np.int64).tobytes())
            data = column.buffers()[2]
            if data is not None:
                digest.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        else:
            digest.update(column.to_numpy().tobytes())
    return digest.hexdigest()[:16]


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Bytes as ``binary`` (Polars writes ``binary_view``), numbers as int64."""
    kind = column.type
    if pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind) or pa.types.is_string(kind):
        return column.cast(pa.binary())
    return column if pa.types.is_binary(kind) else column.cast(pa.int64())


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def read_files_once(path: Path) -> None:
    """Read every file under ``path`` (or the file) once, so the timed job finds its input in the page cache."""
    files = [entry for entry in path.rglob("*") if entry.is_file()] if path.is_dir() else [path]
    buffer = bytearray(16 * MiB)
    for file_path in files:
        with open(file_path, "rb", buffering=0) as file:
            while file.readinto(buffer):
                pass
