"""The remote tier's workloads (issue 16): uploading sealed segments, compacting and scanning a log whose sealed
segments are all on the remote tier, each beside the same work on local segments and beside a plain pyarrow
transfer of the same bytes to or from the same server.

The remote tier is moto's S3 server (bench/s3_server.py: its server mode, in a process of its own, over HTTP on
127.0.0.1), spoken to by pyarrow's and boto3's own S3 clients, as in the storage tests. moto, a Python server on
the same two cores, sets the absolute speed, which is why every remote row stands beside a plain transfer of the
same bytes through the same kind of server, and why the notes give the server's CPU seconds.

A case is a preparer and a job, as in bench/compaction.py. The preparer (untimed, a process of its own) appends
the dataset to a local store whose topic has SEGMENT_BYTES segments and rolls it, so every segment is sealed; for
``remote-scan`` the first 90% is compacted before the last 10% is appended, so that the compacted view is a
ledger followed by a raw tail. Each remote job starts a server of its own, so it first does, untimed: copy the
prepared store beside it, start the server with a fresh bucket, open the copy with that remote tier, set
``remote.storage.enable=true`` and ``local.retention.ms=0``, and (except for the upload case) ``sync_remote`` and
``enforce_retention``, which drop every local copy. Then it times the same work a local job times, on a fresh
Store (no fetched segment cached), and reports its own seconds; the server stops and the copy goes at its end.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from bench.compaction import Job, MiB, Outcome, Preparer, append_table, ledgerview_store, remove
from bench.s3_server import S3Server, s3_server
from bench.systems import TOPIC
from compactor import Compactor
from ledgerview.changelog import ChangelogSpec
from readers import Reader
from storage import Store
from storage.compacted import CompactedLedgers
from storage.files import LOG_SUFFIX, partition_folder
from storage.key_index import KeyIndex
from storage.ledger import Ledger
from storage.object_store import ObjectStore
from storage.remote_key_index import write_flat_key_index
from storage.remote_tier import open_remembered_tier

REMOTE_MESSAGES = 1_000_000
"""The remote workloads' dataset size unless --messages says otherwise: moto moves about 30-60 MB/s in, so 10M
messages (1.45 GB of segments) would take half a minute per upload, and each remote case uploads once."""
SEGMENT_BYTES = 32 * MiB
"""Five sealed segments for the default 1M messages (about 145 MB of segment files)."""
TIER_CONFIG = {"remote.storage.enable": "true", "local.retention.ms": "0", "retention.ms": "-1"}
"""Tiered, every uploaded segment's local copy dropped at once; nothing expires (the dataset's timestamps are old)."""
SCAN_TAIL_SHARE = 0.1
"""``remote-scan``: the share of the dataset appended after the first compaction (the compacted view's raw tail)."""


# ------------------------------------------------------------------------------------------------- preparers
def sealed_store(*, compacted_head: bool = False) -> Preparer:
    """The dataset in a 1-partition topic of SEGMENT_BYTES segments, rolled so every segment is sealed (and
    uploadable). ``compacted_head``: the first 1 - SCAN_TAIL_SHARE of it compacted before the rest is appended."""

    def prepare(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
        tail = round(table.num_rows * SCAN_TAIL_SHARE) if compacted_head else 0
        config = {"segment.bytes": SEGMENT_BYTES}
        ledgerview_store(config, compact=compacted_head)(table.slice(0, table.num_rows - tail), spec, target)
        with Store.open(target) as store:
            append_table(store, table.slice(table.num_rows - tail))
            store.roll(TOPIC, 0)

    return prepare


# --------------------------------------------------------------------------------------------------- the tier
@dataclass(frozen=True)
class Tier:
    folder: Path
    """The tiered copy of the prepared store; it remembers the server's URI, so ``Store.open(folder)`` reads
    through it."""
    server: S3Server


@contextmanager
def tiered_copy(target: Path, *, upload: bool = True) -> Iterator[Tier]:
    """A copy of the prepared store at ``target``, tiered to a fresh S3 server; with ``upload``, its sealed
    segments uploaded and their local copies dropped, so every read of them goes to the server. The copy and the
    server go at the end."""
    folder = target.parent / f"{target.name}-tiered"
    remove(folder)
    shutil.copytree(target, folder)
    try:
        with s3_server() as server:
            with Store.open(folder, remote=server.uri) as store:
                store.alter_topic_config(TOPIC, set=TIER_CONFIG)
                if upload:
                    store.sync_remote(TOPIC)
                    last = max(segment.max_timestamp for segment in store.partition_log(TOPIC, 0).segments)
                    store.enforce_retention(TOPIC, now_ms=last + 1)  # local.retention.ms=0: past it by 1 ms
                    assert len(store.partition_log(TOPIC, 0).segments) == 1, "a sealed segment is still local"
            yield Tier(folder, server)
    finally:
        remove(folder)


@dataclass
class Transfers:
    """What a timed job moved to and from the remote tier, on any thread (the compactor fetches on its read-ahead
    thread): reads are ``ObjectStore.read`` and ``read_range``, writes ``upload`` and ``create``."""

    reads: int = 0
    read_bytes: int = 0
    read_seconds: float = 0.0
    writes: int = 0
    written_bytes: int = 0
    write_seconds: float = 0.0
    server_cpu_seconds: float = 0.0

    def add(self, write: bool, size: int, seconds: float) -> None:
        if write:
            self.writes, self.written_bytes, self.write_seconds = (
                self.writes + 1, self.written_bytes + size, self.write_seconds + seconds)
        else:
            self.reads, self.read_bytes, self.read_seconds = (
                self.reads + 1, self.read_bytes + size, self.read_seconds + seconds)

    def describe(self) -> str:
        parts = [f"fetched {_rate(self.read_bytes, self.read_seconds)} in {self.reads} reads "
                 f"({self.read_seconds:.3f} s)"]
        if self.writes:
            parts.append(f"uploaded {_rate(self.written_bytes, self.write_seconds)} in {self.writes} writes "
                         f"({self.write_seconds:.3f} s)")
        return "; ".join([*parts, f"server CPU {self.server_cpu_seconds:.2f} s"])


_SIZES: dict[str, Callable[[tuple[Any, ...], Any], int]] = {
    "read": lambda args, result: int(result.size),
    "read_range": lambda args, result: int(result.size),
    "upload": lambda args, result: Path(args[0]).stat().st_size,
    "create": lambda args, result: len(args[1]),
}
"""The ObjectStore methods that move bytes, and how many each call moved."""


@contextmanager
def counted_transfers(server: S3Server) -> Iterator[Transfers]:
    """Count the remote tier's reads and writes (instrumentation: ObjectStore's methods wrapped while inside), and
    the server's CPU time."""
    transfers, lock = Transfers(), threading.Lock()
    originals = {name: getattr(ObjectStore, name) for name in _SIZES}

    def counted(name: str) -> Callable[..., Any]:
        method, size = originals[name], _SIZES[name]

        def call(self: ObjectStore, *args: Any) -> Any:
            start = time.perf_counter()
            result = method(self, *args)
            with lock:
                transfers.add(name in ("upload", "create"), size(args, result), time.perf_counter() - start)
            return result

        return call

    for name in _SIZES:
        setattr(ObjectStore, name, counted(name))
    server_cpu = server.cpu_seconds()
    try:
        yield transfers
    finally:
        transfers.server_cpu_seconds = server.cpu_seconds() - server_cpu
        for name, method in originals.items():
            setattr(ObjectStore, name, method)


def on_remote(job: Job) -> Job:
    """``job`` run on a tiered copy of its input whose sealed segments are all remote (set up untimed); the time
    is the job's own, and the notes add what it moved to and from the remote tier."""

    def remote_job(target: Path, output: Path) -> Outcome:
        with tiered_copy(target) as tier, counted_transfers(tier.server) as transfers:
            start = time.perf_counter()
            outcome = job(tier.folder, output)
            seconds = time.perf_counter() - start if outcome.seconds is None else outcome.seconds
        notes = "; ".join(part for part in (outcome.notes, transfers.describe()) if part)
        return dataclasses.replace(outcome, seconds=seconds, notes=notes)

    return remote_job


def _sealed_files(store: Store) -> list[Path]:
    """The files ``sync_remote`` uploads for the topic's sealed segments, in its order (indexes, then the log)."""
    return [path for segment in store.partition_log(TOPIC, 0).segments[:-1]
            for path in (segment.offset_index.path, segment.time_index.path, segment.log_path)]


def _rate(size: int, seconds: float, what: str = "") -> str:
    rate = f", {size / seconds / 1e6:,.0f} MB/s" if seconds else ""
    return f"{size / 1e6:,.1f} MB{f' of {what}' if what else ''}{rate}"


# --------------------------------------------------------------------------------------------------- upload
def ledgerview_upload(target: Path, output: Path) -> Outcome:
    """``store.sync_remote(topic)`` of every sealed segment (the store opened with its tier untimed)."""
    with tiered_copy(target, upload=False) as tier, Store.open(tier.folder) as store:
        size = sum(path.stat().st_size for path in _sealed_files(store))
        with counted_transfers(tier.server) as transfers:
            start = time.perf_counter()
            [result] = store.sync_remote(TOPIC)
            seconds = time.perf_counter() - start
    notes = (f"segments uploaded: {len(result.uploaded)}, {_rate(size, seconds, 'segment files')}; "
             f"{transfers.describe()}")
    return Outcome(None, seconds=seconds, notes=notes)


def copy_files_floor(target: Path, output: Path) -> Outcome:
    """The same files with ``pyarrow.fs.copy_files``, one call per file as ``sync_remote`` makes, to fresh keys."""
    with Store.open(target) as store:
        return _copy_files(_sealed_files(store), "segment files")


def _copy_files(files: list[Path], what: str) -> Outcome:
    """``files`` copied to a fresh server with ``pyarrow.fs.copy_files``, one call each, to fresh keys; timed."""
    local = pafs.LocalFileSystem()
    with s3_server() as server:
        filesystem, base = pafs.FileSystem.from_uri(server.uri)
        server_cpu, start = server.cpu_seconds(), time.perf_counter()
        for path in files:
            pafs.copy_files(str(path), f"{base}/{uuid.uuid4().hex}/{path.name}", source_filesystem=local,
                            destination_filesystem=filesystem)
        seconds = time.perf_counter() - start
        server_cpu = server.cpu_seconds() - server_cpu
    size = sum(path.stat().st_size for path in files)
    return Outcome(None, seconds=seconds, notes=f"files: {len(files)}, {_rate(size, seconds, what)}; "
                                                f"server CPU {server_cpu:.2f} s")


def result_copy_floor(target: Path, output: Path) -> Outcome:
    """What a tiered compaction uploads besides compacting, as plain copies: the ledger and its key index flattened
    (as storage/remote_key_index.py writes it), both made untimed by a local compaction of the same segments."""
    with Store.open(target) as store:
        [result] = Compactor(store).compact(TOPIC)
    assert result.ledger_id is not None, result
    ledgers = CompactedLedgers(partition_folder(target, TOPIC, 0))
    ledger_path = ledgers.ledger_paths(result.ledger_id)[0]
    flat = output.with_name(f"{output.name}.flat-key-index")
    opened = ledgers.open_current()
    assert opened is not None
    try:
        assert isinstance(opened[1], Ledger) and isinstance(opened[1].keys, KeyIndex)
        write_flat_key_index(opened[1].keys.entries(), flat)
    finally:
        opened[1].close()
    try:
        return _copy_files([flat, ledger_path], "flat key index + ledger")
    finally:
        flat.unlink()


# ----------------------------------------------------------------------------------------------- plain read
def remote_read_floor(target: Path, output: Path) -> Outcome:
    """Every uploaded segment log object read whole with pyarrow (``open_input_file(...).read_buffer()``, as the
    remote tier reads it), from the same kind of server; listing them is untimed."""
    with tiered_copy(target) as tier:
        filesystem, base = pafs.FileSystem.from_uri(tier.server.uri)
        logs = sorted(info.path for info in filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
                      if info.path.endswith(LOG_SUFFIX))
        size = 0
        server_cpu, start = tier.server.cpu_seconds(), time.perf_counter()
        for path in logs:
            with filesystem.open_input_file(path) as source:
                size += source.read_buffer().size
        seconds = time.perf_counter() - start
        server_cpu = tier.server.cpu_seconds() - server_cpu
    return Outcome(None, seconds=seconds, notes=f"objects: {len(logs)}; {_rate(size, seconds, 'segment logs')}; "
                                                f"server CPU {server_cpu:.2f} s")


# ----------------------------------------------------------------------------------------------------- scans
def raw_scan(target: Path, output: Path) -> Outcome:
    """Store.open, ``store.read_batches`` over every partition summing ``num_rows``, close."""
    with Store.open(target) as store:
        partitions = store.topic_metadata(TOPIC).partitions
        messages = sum(int(batch.num_rows) for partition in range(partitions)
                       for batch in store.read_batches(TOPIC, partition))
    return Outcome(messages)


def compacted_view_scan(target: Path, output: Path) -> Outcome:
    """Store.open, ``Reader(store, topic, read_compacted=True).batches()`` summing ``num_rows``, close."""
    with Store.open(target) as store:
        return _compacted_view(store)


def remote_tier_compacted_scan(target: Path, output: Path) -> Outcome:
    """The compacted view read from the remote tier alone, as a machine without the data folder reads it:
    ``Reader("s3://…", topic, read_compacted=True).batches()`` (the ledger and the raw tail both fetched)."""
    objects = open_remembered_tier(target, None)
    assert objects is not None, f"{target} is not tiered"
    return _compacted_view(objects.uri)


def _compacted_view(store: Store | str) -> Outcome:
    with Reader(store, TOPIC, read_compacted=True) as reader:
        return Outcome(sum(int(batch.num_rows) for batch in reader.batches()))
