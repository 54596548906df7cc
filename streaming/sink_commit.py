"""The sink's commit: append a micro-batch's staged files to the topic and record its batch id, exactly once.

A sink (one streaming query, named by Spark's query id, which survives restarts from the checkpoint) keeps a
record in the store, ``__sinks/<topic>/<sink id>/sink.json``: the last committed batch id and, while a commit is
under way, the pending one: its files (moved out of staging) with their CRC-32C and, per partition, the offset its
rows start at and how many of its rows were already in the log then. The record is replaced atomically
(storage.fileio.write_atomically) and only under the writer locks of every partition of the topic.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import crc32c
import numpy as np
import pyarrow as pa

from storage import Store, faults
from storage.errors import LedgerviewError, OffsetOutOfRangeError
from storage.fileio import write_atomically
from storage.files import (
    SINK_PENDING_FOLDER,
    SINK_RECORD,
    SINK_STAGING_FOLDER,
    parse_staged_batch,
    sink_folder,
)
from storage.records import CorruptRecordError, decode_record, encode_record

SINK_RECORD_KIND = "sink"
RECORD_VERSION = 2
"""1: the unchecksummed record of earlier releases (still read); 2: storage/records.py's format."""
COMPARED_COLUMNS = ("key", "value", "headers")


class SinkStateError(LedgerviewError):
    def __init__(self, folder: Path, reason: str) -> None:
        super().__init__(f"Sink record in {folder} cannot be used: {reason}.")


@dataclass(frozen=True)
class PartitionStart:
    """Where the pending batch's rows of one partition go."""

    offset: int
    """The log's end offset when these rows' append began (under the partition's writer lock)."""
    rows_before: int
    """How many of the batch's rows for this partition were already in the log before that append."""


@dataclass(frozen=True)
class SinkRecord:
    committed_batch: int = -1
    """The last batch id whose rows are all in the topic; -1 before the first."""
    pending_batch: int | None = None
    """The batch being committed, when a commit began and has not finished."""
    pending_files: tuple[str, ...] = ()
    """Its staged files, moved into ``pending/``, in task order."""
    pending_starts: dict[int, PartitionStart] = field(default_factory=dict)
    pending_checksums: tuple[int, ...] = ()
    """The CRC-32C of each pending file (none in records of versions that fsynced staged files instead)."""

    def encode(self) -> bytes:
        record = asdict(self)
        record["pending_starts"] = {str(p): asdict(start) for p, start in self.pending_starts.items()}
        return encode_record(SINK_RECORD_KIND, RECORD_VERSION, record)

    @classmethod
    def read(cls, path: Path) -> SinkRecord:
        try:
            _, data = decode_record(path, path.read_bytes(), SINK_RECORD_KIND, max_version=RECORD_VERSION, legacy=True)
        except FileNotFoundError:
            return cls()
        except CorruptRecordError as error:
            raise SinkStateError(path.parent, error.reason) from error
        return cls(
            committed_batch=data["committed_batch"],
            pending_batch=data["pending_batch"],
            pending_files=tuple(data["pending_files"]),
            pending_starts={int(p): PartitionStart(**start) for p, start in data["pending_starts"].items()},
            pending_checksums=tuple(data.get("pending_checksums", ())),
        )


@dataclass(frozen=True)
class SinkFolders:
    root: Path
    staging: Path
    pending: Path
    record: Path

    @classmethod
    def of(cls, store: Store, topic: str, sink_id: str) -> SinkFolders:
        root = sink_folder(store.root, topic, sink_id)
        return cls(root, root / SINK_STAGING_FOLDER, root / SINK_PENDING_FOLDER, root / SINK_RECORD)


def read_committed_batch(store: Store, topic: str, sink_id: str) -> int:
    """The last batch id the sink committed into ``topic`` (-1 if none)."""
    return SinkRecord.read(SinkFolders.of(store, topic, sink_id).record).committed_batch


def commit_batch(store: Store, topic: str, sink_id: str, batch_id: int, staged: dict[str, int]) -> bool:
    """Append the staged files of ``batch_id`` (names and CRC-32C, in task order) to ``topic`` exactly once;
    False when it was already committed.

    Every step runs under the writer locks of all the topic's partitions (taken in partition order), so no other
    commit and no other writer moves the logs meanwhile; a ``kill -9`` releases them.

    1. Read the sink record. If it says ``batch_id`` is committed (Spark re-runs a batch whose commit it did not
       see finish), go to 6: nothing is appended twice.
    2. If no commit is pending: move this attempt's staged files into ``pending/``, then write the record naming
       them and their CRC-32C as the pending batch, with each partition's end offset as its rows' start and 0
       rows before. A crash before the record write leaves files in ``pending/`` that no record names: step 6 of
       the next commit removes them and the replayed batch is staged anew. After it, the batch's content is
       fixed: a replay rolls it forward from these files, whatever the re-run's own files hold.
       If a commit is pending it must be ``batch_id`` (Spark replays the unfinished batch first). Staged files
       are never fsynced (tasks and the commit that reads them run in one boot, so the page cache holds them): if
       a pending file is missing or fails its CRC-32C, a power loss took it, and this attempt's files replace
       the pending ones in the record, with the recorded starts. The re-run staged the same rows (exactly-once
       requires a source that replays a batch as it was), so step 3 still finds what the log holds.
    3. For each partition, find how many of the pending rows are in the log: the batches from the recorded start
       whose key, value and headers equal the next rows (a crash keeps a prefix of an append; whatever other
       writers appended after the crash follows it and does not match). When some rows are missing and some
       others are there (a resumed commit), record the new start and count first, so that a crash in the
       append below is resumed from there. Then append the missing rows. A crash here is resumed by step 3.
    4. Flush the partitions (fsync; recovery point moved), so the record never claims rows a power cut loses.
    5. Write the record: ``batch_id`` committed, nothing pending. This is the commit point. A crash before it
       re-runs step 3, which finds every row present and appends nothing.
    6. Remove the pending files, and the staged files of this and older batches (abandoned attempts). A crash
       here leaves files the next commit removes.
    """
    folders = SinkFolders.of(store, topic, sink_id)
    folders.staging.mkdir(parents=True, exist_ok=True)
    folders.pending.mkdir(exist_ok=True)
    appended = False
    with _all_writer_locks(store, topic):
        record = SinkRecord.read(folders.record)
        if record.committed_batch < batch_id:
            if record.pending_batch is None:
                partitions = store.topic_metadata(topic).partitions
                starts = {p: PartitionStart(store.end_offset(topic, p), 0) for p in range(partitions)}
                record = _pend(folders, record, batch_id, staged, starts)
                crash_jvm_at("sink.commit.after_pending_record")
            elif record.pending_batch != batch_id:
                raise SinkStateError(folders.root, f"batch {record.pending_batch} is pending and batch {batch_id} "
                                     "was asked to commit; was the checkpoint replaced or shared?")
            elif not _pending_files_intact(folders, record):
                record = _pend(folders, record, batch_id, staged, record.pending_starts)
            _roll_forward(store, topic, folders, record)
            store.flush(topic)
            crash_jvm_at("sink.commit.before_committed_record")
            write_atomically(folders.record, SinkRecord(committed_batch=batch_id).encode())
            crash_jvm_at("sink.commit.after_committed_record")
            appended = True
        _remove_finished_files(folders, SinkRecord.read(folders.record))
    return appended


def remove_staged_batch(store: Store, topic: str, sink_id: str, batch_id: int) -> None:
    """Remove the staged files of a batch Spark aborted (a failed task's files are not in its messages)."""
    staging = SinkFolders.of(store, topic, sink_id).staging
    for name in _names(staging):
        if parse_staged_batch(name) == batch_id:
            _unlink(staging / name)


def file_checksum(path: Path) -> int:
    """CRC-32C of a whole file, read through a memory map."""
    with pa.memory_map(str(path)) as source:
        return int(crc32c.crc32c(source.read_buffer()))


def _pend(folders: SinkFolders, record: SinkRecord, batch_id: int, staged: dict[str, int],
          starts: dict[int, PartitionStart]) -> SinkRecord:
    """Step 2: ``staged`` become the pending files of ``batch_id`` (replacing any in ``pending/``)."""
    for name in _names(folders.pending):  # moved by a begin that died before its record, or damaged (step 2)
        _unlink(folders.pending / name)
    for name in staged:
        os.replace(folders.staging / name, folders.pending / name)
    pending = SinkRecord(record.committed_batch, batch_id, tuple(staged), starts, tuple(staged.values()))
    write_atomically(folders.record, pending.encode())
    return pending


def _pending_files_intact(folders: SinkFolders, record: SinkRecord) -> bool:
    """Whether every pending file is there with its recorded CRC-32C (records without them: trusted)."""
    if not record.pending_checksums:
        return True
    for name, checksum in zip(record.pending_files, record.pending_checksums, strict=True):
        try:
            if file_checksum(folders.pending / name) != checksum:
                return False
        except FileNotFoundError:
            return False
    return True


def _roll_forward(store: Store, topic: str, folders: SinkFolders, record: SinkRecord) -> None:
    starts = dict(record.pending_starts)
    for partition, rows in read_staged(folders.pending, record.pending_files).items():
        start = starts[partition]
        try:
            present = start.rows_before + _rows_in_log(store, topic, partition, start.offset,
                                                       rows.slice(start.rows_before))
        except OffsetOutOfRangeError as error:
            raise SinkStateError(folders.root, f"retention deleted offsets a pending commit needs ({error})") \
                from error
        if present == rows.num_rows:
            continue
        if present != start.rows_before:
            starts[partition] = PartitionStart(store.end_offset(topic, partition), present)
            record = replace(record, pending_starts=dict(starts))
            write_atomically(folders.record, record.encode())
        store.append(topic, rows.slice(present), partition=partition)
        crash_jvm_at("sink.commit.after_partition_append")


def _rows_in_log(store: Store, topic: str, partition: int, start: int, rows: pa.Table) -> int:
    """How many leading ``rows`` the log holds from offset ``start`` on, compared batch by batch."""
    present = 0
    for batch in store.read_batches(topic, partition, start):
        if present + batch.num_rows > rows.num_rows:
            break
        ours = rows.slice(present, batch.num_rows).select(list(COMPARED_COLUMNS))
        if not pa.Table.from_batches([batch.select(list(COMPARED_COLUMNS))]).equals(ours):
            break
        present += batch.num_rows
    return present


def partition_runs(table: pa.Table) -> Iterator[pa.Table]:
    """The rows of ``table`` (with a partition column) of each target partition in turn, in their order; the
    table itself, without a copy, when they all go to one partition; nothing for an empty table."""
    if table.num_rows == 0:
        return
    targets = table.column("partition").to_numpy()
    if targets.min() == targets.max():
        yield table
        return
    order = np.argsort(targets, kind="stable")
    bounds = np.flatnonzero(np.diff(targets[order])) + 1
    grouped = table.take(pa.array(order))
    for start, stop in zip([0, *bounds], [*bounds, table.num_rows], strict=True):
        yield grouped.slice(start, stop - start)


def read_staged(folder: Path, names: tuple[str, ...] | list[str]) -> dict[int, pa.Table]:
    """The staged files' rows of each target partition, in task order, without the partition column; zero-copy
    from the files' memory maps when each record batch is one partition's, as tasks write them."""
    runs: dict[int, list[pa.Table]] = {}
    for name in names:
        with pa.memory_map(str(folder / name)) as source:
            reader = pa.ipc.open_file(source)
            for index in range(reader.num_record_batches):
                for run in partition_runs(pa.Table.from_batches([reader.get_batch(index)])):
                    partition = int(run.column("partition")[0].as_py())
                    runs.setdefault(partition, []).append(run.drop_columns(["partition"]))
    return {partition: pa.concat_tables(tables) for partition, tables in sorted(runs.items())}


def _remove_finished_files(folders: SinkFolders, record: SinkRecord) -> None:
    """Files of committed batches and of abandoned attempts; never those the record names as pending."""
    keep = set(record.pending_files)
    for name in _names(folders.pending):
        if name not in keep:
            _unlink(folders.pending / name)
    for name in _names(folders.staging):
        batch = parse_staged_batch(name)
        if batch is not None and batch <= record.committed_batch:
            _unlink(folders.staging / name)


@contextlib.contextmanager
def _all_writer_locks(store: Store, topic: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for partition in range(store.topic_metadata(topic).partitions):
            stack.enter_context(store.partition_log(topic, partition).writer_lock.waiting())
        yield


def crash_jvm_at(point: str) -> None:
    """A fault-test crash point that kills the whole Spark application, not only this Python worker: the
    commit runs in a worker the JVM spawned, and a real crash takes the JVM with it."""
    if faults.is_armed(point):
        _kill_jvm_ancestor()
        faults.crash()


def _kill_jvm_ancestor() -> None:
    pid = os.getppid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name == "java":
            os.kill(pid, 9)
            return
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])


def _names(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in folder.iterdir())
    except FileNotFoundError:
        return []


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
