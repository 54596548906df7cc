"""The sink's commit: append a micro-batch's staged files to the topic and record its batch id, exactly once.

A sink (one streaming query, named by Spark's query id, which survives restarts from the checkpoint) keeps a
record in the store, ``__sinks/<topic>/<sink id>/sink.json``: the last committed batch id and, while a commit is
under way, the pending one: its files (moved out of staging) and, per partition, the offset its rows start at
and how many of its rows were already in the log then. The record is replaced atomically
(storage.fileio.write_atomically) and only under the writer locks of every partition of the topic.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage import Store, faults
from storage.errors import LedgerviewError, OffsetOutOfRangeError
from storage.fileio import fsync_folder, write_atomically
from storage.files import (
    SINK_PENDING_FOLDER,
    SINK_RECORD,
    SINK_STAGING_FOLDER,
    parse_staged_batch,
    sink_folder,
)

RECORD_VERSION = 1
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

    def encode(self) -> bytes:
        record = asdict(self)
        record["pending_starts"] = {str(p): asdict(start) for p, start in self.pending_starts.items()}
        return json.dumps({"version": RECORD_VERSION, **record}).encode()

    @classmethod
    def read(cls, path: Path) -> SinkRecord:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls()
        except ValueError as error:
            raise SinkStateError(path.parent, f"unreadable record ({error})") from error
        if data.pop("version", None) != RECORD_VERSION:
            raise SinkStateError(path.parent, f"unknown record version, expected {RECORD_VERSION}")
        return cls(
            committed_batch=data["committed_batch"],
            pending_batch=data["pending_batch"],
            pending_files=tuple(data["pending_files"]),
            pending_starts={int(p): PartitionStart(**start) for p, start in data["pending_starts"].items()},
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


def commit_batch(store: Store, topic: str, sink_id: str, batch_id: int, staged: list[str]) -> bool:
    """Append the staged files of ``batch_id`` to ``topic`` exactly once; False when it was already committed.

    Every step runs under the writer locks of all the topic's partitions (taken in partition order), so no other
    commit and no other writer moves the logs meanwhile; a ``kill -9`` releases them.

    1. Read the sink record. If it says ``batch_id`` is committed (Spark re-runs a batch whose commit it did not
       see finish), go to 6: nothing is appended twice.
    2. If no commit is pending: move this attempt's staged files into ``pending/`` (fsync the folder), then write
       the record naming them as the pending batch, with each partition's end offset as its rows' start and 0
       rows before. A crash before the record write leaves files in ``pending/`` that no record names: step 6 of
       the next commit removes them and the replayed batch is staged anew. After it, the batch's content is
       fixed: a replay rolls it forward from these files, whatever the re-run's own files hold.
       If a commit is pending it must be ``batch_id`` (Spark replays the unfinished batch first).
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
    _crash_at("sink.commit.begin")
    folders = SinkFolders.of(store, topic, sink_id)
    folders.staging.mkdir(parents=True, exist_ok=True)
    folders.pending.mkdir(exist_ok=True)
    appended = False
    with _all_writer_locks(store, topic):
        record = SinkRecord.read(folders.record)
        if record.committed_batch < batch_id:
            if record.pending_batch is None:
                record = _begin(store, topic, folders, record, batch_id, staged)
                _crash_at("sink.commit.after_pending_record")
            elif record.pending_batch != batch_id:
                raise SinkStateError(folders.root, f"batch {record.pending_batch} is pending and batch {batch_id} "
                                     "was asked to commit; was the checkpoint replaced or shared?")
            _roll_forward(store, topic, folders, record)
            store.flush(topic)
            _crash_at("sink.commit.before_committed_record")
            write_atomically(folders.record, SinkRecord(committed_batch=batch_id).encode())
            _crash_at("sink.commit.after_committed_record")
            appended = True
        _remove_finished_files(folders, SinkRecord.read(folders.record))
    return appended


def remove_staged_batch(store: Store, topic: str, sink_id: str, batch_id: int) -> None:
    """Remove the staged files of a batch Spark aborted (a failed task's files are not in its messages)."""
    staging = SinkFolders.of(store, topic, sink_id).staging
    for name in _names(staging):
        if parse_staged_batch(name) == batch_id:
            _unlink(staging / name)


def _begin(store: Store, topic: str, folders: SinkFolders, record: SinkRecord, batch_id: int,
           staged: list[str]) -> SinkRecord:
    for name in _names(folders.pending):  # moved by a begin that died before its record (step 2)
        _unlink(folders.pending / name)
    for name in staged:
        os.replace(folders.staging / name, folders.pending / name)
    fsync_folder(folders.pending)
    fsync_folder(folders.staging)
    partitions = store.topic_metadata(topic).partitions
    starts = {p: PartitionStart(store.end_offset(topic, p), 0) for p in range(partitions)}
    pending = SinkRecord(record.committed_batch, batch_id, tuple(staged), starts)
    write_atomically(folders.record, pending.encode())
    return pending


def _roll_forward(store: Store, topic: str, folders: SinkFolders, record: SinkRecord) -> None:
    table = read_staged(folders.pending, record.pending_files)
    starts = dict(record.pending_starts)
    for partition, rows in _rows_by_partition(table):
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
            record = SinkRecord(record.committed_batch, record.pending_batch, record.pending_files, starts)
            write_atomically(folders.record, record.encode())
        store.append(topic, rows.slice(present), partition=partition)
        _crash_at("sink.commit.after_partition_append")


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


def _rows_by_partition(table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """The rows of each target partition, in staged order (no partition column)."""
    if table.num_rows == 0:
        return
    targets = table.column("partition").to_numpy()
    order = np.argsort(targets, kind="stable")
    bounds = np.flatnonzero(np.diff(targets[order])) + 1
    rows = table.drop_columns(["partition"])
    for chosen in np.split(order, bounds):
        yield int(targets[chosen[0]]), rows.take(pa.array(chosen))


def read_staged(folder: Path, names: tuple[str, ...] | list[str]) -> pa.Table:
    """The staged files as one table (columns key, value, timestamp, headers, partition)."""
    tables = []
    for name in names:
        with pa.memory_map(str(folder / name)) as source:
            tables.append(pa.ipc.open_file(source).read_all())
    return pa.concat_tables(tables) if tables else pa.table({})


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


def _crash_at(point: str) -> None:
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
