"""Compacted ledgers: immutable files of batches in the segment format, with a key index beside each.

A ledger holds messages with their original offsets, timestamps and headers, in offset order. It is written once
by ``LedgerWriter`` and then only read. Which ledger a partition's compacted view uses is named by its compaction
cursor (storage/compaction_cursor.py); a ledger no cursor names is an orphan.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import pyarrow as pa

from storage.codec import BatchFormatError, BatchHeader, decode_payload, encode_batch, verify_batch
from storage.errors import CorruptLedgerError
from storage.fileio import fsync_folder, write_all
from storage.key_index import KeyIndex, KeyIndexError, KeyIndexWriter
from storage.partition_log import estimated_message_bytes
from storage.remote_key_index import FlatKeyIndexes
from storage.scanned_keys import ScannedKeys, scanned_keys
from storage.segment import scan_headers

logger = logging.getLogger(__name__)

BATCH_BYTES = 1 << 20
"""What a ledger batch holds at most, in messages' estimated bytes (a larger message has a batch of its own): a
damaged byte costs the batch that holds it, and a point lookup checks and decodes one batch. Kafka's default
max.message.bytes, the largest batch a broker takes, is about this."""


def bounded_slices(batch: pa.RecordBatch, limit_bytes: int) -> Iterator[pa.RecordBatch]:
    """Consecutive slices of ``batch`` holding at most ``limit_bytes`` of messages each, or one larger message."""
    ends = np.cumsum(estimated_message_bytes(pa.Table.from_batches([batch])))
    start = 0
    while start < batch.num_rows:
        before = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, before + limit_bytes, side="right")), start + 1)
        yield batch.slice(start, stop - start)
        start = stop


WRITE_BEHIND_BYTES = 16 << 20
"""Each time this much more has been written, the writer starts an fdatasync of the ledger on a thread of its own:
the disk writes back while the compactor goes on, and ``finish``'s fsync waits only for the tail (on a 76 MB
ledger its wait fell from 0.113 s to 0.035 s, bench/compaction_phases.py)."""


class LedgerWriter:
    """Writes one ledger: batches in offset order, and its key index (``keys``), fed with sorted runs of the
    ledger's keys by whoever knows them (the compactor's phase one) while the batches are written."""

    def __init__(self, path: Path, key_index_path: Path, *, compression: str | None, key_index: bool = True) -> None:
        """``key_index``: false writes the ledger without a key index (compaction.key.index)."""
        self.path = path
        self.compression = compression
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.keys = KeyIndexWriter(key_index_path, indexed=key_index)
        self.size_bytes = 0
        self.messages = 0
        self._last_offset = -1
        self._write_behind = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledgerview-ledger-sync")
        self._syncing: Future[None] | None = None
        self._synced_bytes = 0

    def append(self, batch: pa.RecordBatch) -> None:
        """Append a record batch of STORED_SCHEMA whose offsets are above every offset written so far, as ledger
        batches of about BATCH_BYTES each (see ``bounded_slices``)."""
        if batch.num_rows == 0:
            return
        offsets = batch.column(0)
        if offsets[0].as_py() <= self._last_offset:
            raise ValueError(f"ledger offsets must increase: {offsets[0].as_py()} after {self._last_offset}")
        for piece in bounded_slices(batch, BATCH_BYTES):
            encoded = encode_batch(piece, compression=self.compression)
            write_all(self._fd, encoded.pieces)
            self.size_bytes += encoded.header.batch_length
        self.messages += batch.num_rows
        self._last_offset = int(offsets[-1].as_py())
        if self.size_bytes - self._synced_bytes >= WRITE_BEHIND_BYTES and (
                self._syncing is None or self._syncing.done()):
            self._wait_for_write_behind()
            self._syncing = self._write_behind.submit(os.fdatasync, self._fd)
            self._synced_bytes = self.size_bytes

    def _wait_for_write_behind(self) -> None:
        """Wait for the started fdatasync, if any, and raise its error (a failed write-back fails the ledger)."""
        if self._syncing is not None:
            syncing, self._syncing = self._syncing, None
            syncing.result()

    def finish(self) -> None:
        """Make the ledger and its index durable; only then may a cursor record name it."""
        try:
            self._wait_for_write_behind()
        finally:
            self._write_behind.shutdown(wait=True)
        os.fsync(self._fd)
        os.close(self._fd)
        self.keys.finish()
        fsync_folder(self.path.parent)

    def abort(self) -> None:
        self._write_behind.shutdown(wait=True)  # no fdatasync may still use the descriptor once it is closed
        os.close(self._fd)
        self.path.unlink(missing_ok=True)
        self.keys.abort()


class LedgerReads(Protocol):
    """What readers ask of a compacted view: one ledger (``Ledger``, ``RemoteLedger``) or several layered ones
    (storage/ledger_layers.py)."""

    source: str
    headers: list[BatchHeader]
    """The batch headers of every ledger the view reads, in offset order (offsets never overlap)."""

    @property
    def messages(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    def read_batches(self, start_offset: int = 0, end_offset: int | None = None) -> Iterator[pa.RecordBatch]: ...

    def offset_of(self, key: bytes) -> int | None: ...

    @property
    def key_indexed(self) -> bool:
        """Whether every ledger of the view has a key index (compaction.key.index was true when it was written)."""
        ...

    def lookup(self, key: bytes) -> pa.RecordBatch | None: ...

    def close(self) -> None: ...


class Ledger:
    """A finished ledger opened for reading: memory-mapped, its batch headers read once, its key index open.
    storage/remote_ledger.py reads one from the remote tier with the same methods."""

    corrupt_batch_error: ClassVar[type[CorruptLedgerError]] = CorruptLedgerError
    """What a damaged batch raises: its advice says how to rebuild a view where it is stored."""

    def __init__(self, path: Path, key_index_path: Path, *, verify: bool = True) -> None:
        size = path.stat().st_size
        if size:
            with pa.memory_map(str(path), "r") as mapped:
                self._buffer = mapped.read_buffer()
        else:
            self._buffer = pa.py_buffer(b"")
        try:
            headers = list(scan_headers(memoryview(self._buffer), 0, size, None))
        except BatchFormatError as error:
            raise CorruptLedgerError(str(path), error.position, -1, error.reason) from error
        self._set_up(str(path), headers, KeyIndex(key_index_path), verify=verify)

    def _set_up(self, source: str, headers: list[BatchHeader], keys: KeyIndex | FlatKeyIndexes, *,
                verify: bool) -> None:
        self.source = source
        """Where the ledger is, for errors: a path or a URI."""
        for before, header in itertools.pairwise(headers):
            if header.base_offset <= before.last_offset:
                # A damaged header (its CRC is checked only when the batch is read): a reader would skip or
                # misplace a batch by it
                keys.close()
                raise self.corrupt_batch_error(
                    source, header.position, -1, f"its batch headers' offsets do not increase (offsets "
                    f"{before.base_offset} to {before.last_offset}, then {header.base_offset} to {header.last_offset})")
        self.headers = headers
        self.keys = keys
        self.verify = verify
        self._bases = [header.base_offset for header in headers]
        self._first_rows = np.concatenate(([0], np.cumsum([header.record_count for header in headers])))
        self._verified: set[int] = set()
        self._scanned_keys: ScannedKeys | None = None

    @property
    def messages(self) -> int:
        return sum(header.record_count for header in self.headers)

    @property
    def size_bytes(self) -> int:
        return sum(header.batch_length for header in self.headers)

    def _batch_bytes(self, header: BatchHeader) -> tuple[pa.Buffer, BatchHeader]:
        """A buffer holding the batch and the header placed in it (a subclass may fetch the batch alone)."""
        return self._buffer, header

    def _decode(self, header: BatchHeader) -> pa.RecordBatch:
        """Decode a batch, checking its CRC the first time this reader touches it (a ledger never changes)."""
        buffer, placed = self._batch_bytes(header)
        try:
            if self.verify and header.position not in self._verified:
                verify_batch(memoryview(buffer), placed)
                self._verified.add(header.position)
            return decode_payload(buffer, placed)
        except BatchFormatError as error:
            raise self.corrupt_batch_error(self.source, header.position, header.base_offset, error.reason) from error

    def read_batches(self, start_offset: int = 0, end_offset: int | None = None) -> Iterator[pa.RecordBatch]:
        """Batches of STORED_SCHEMA with start_offset <= offset < end_offset, in offset order."""
        for _, batch in self.read_numbered_batches(start_offset, end_offset):
            yield batch

    def read_numbered_batches(self, start_offset: int = 0, end_offset: int | None = None) -> (
        Iterator[tuple[int, pa.RecordBatch]]
    ):
        """``read_batches``, each batch with the number of its first row among all the ledger's rows (what a
        layer's deleted rows are counted by, storage/ledger_layers.py)."""
        first = max(bisect.bisect_right(self._bases, start_offset) - 1, 0)
        for index in range(first, len(self.headers)):
            header = self.headers[index]
            if header.last_offset < start_offset:
                continue
            if end_offset is not None and header.base_offset >= end_offset:
                return
            batch, row = self._decode(header), int(self._first_rows[index])
            if header.base_offset < start_offset or (end_offset is not None and header.last_offset >= end_offset):
                offsets = batch.column(0).to_numpy()
                lower, upper = np.searchsorted(offsets, [start_offset, end_offset or offsets[-1] + 1])
                batch, row = batch.slice(int(lower), int(upper - lower)), row + int(lower)
            if batch.num_rows:
                yield row, batch

    @property
    def key_indexed(self) -> bool:
        return self.keys.indexed

    def offset_of(self, key: bytes) -> int | None:
        """The offset of ``key``'s message, found through the key index; None if the ledger lacks the key. A
        ledger written without a key index, or whose index turns out damaged (then set aside for the rest of this
        reader's life), has its keys read once (one scan, its CRCs checked) and searched instead
        (storage/scanned_keys.py), so a lookup never answers from damage."""
        if self._scanned_keys is None and self.keys.indexed:
            try:
                return self.keys.locate(key)
            except KeyIndexError as error:
                logger.warning("%s Meanwhile, lookups in ledger %s answer from a scan of it.", error, self.source)
        if self._scanned_keys is None:
            self._scanned_keys = scanned_keys(self.read_batches())
        return self._scanned_keys.offset_of(key)

    def lookup(self, key: bytes) -> pa.RecordBatch | None:
        """The one-row batch holding ``key``'s message (see ``offset_of``); None if absent."""
        found = self.lookup_row(key)
        return None if found is None else found[1]

    def lookup_row(self, key: bytes) -> tuple[int, pa.RecordBatch] | None:
        """``lookup``, with the number of the row among all the ledger's rows."""
        offset = self.offset_of(key)
        if offset is None:
            return None
        index = bisect.bisect_right(self._bases, offset) - 1
        batch = self._decode(self.headers[index]) if index >= 0 else None
        offsets = batch.column(0).to_numpy() if batch is not None else np.empty(0, np.int64)
        row = int(np.searchsorted(offsets, offset))
        if batch is None or row >= len(offsets) or offsets[row] != offset:
            # A damaged or stale index must not hand out a neighbouring message as this key's.
            raise self.keys.damaged(self.keys.path, key, f"it sends the key to offset {offset}, which ledger "
                                    f"{self.source} does not hold")
        if batch.column(2)[row].as_py() != key:  # nor another key's message (an index that passed its checks)
            raise self.keys.damaged(self.keys.path, key, f"it sends the key to offset {offset}, which holds "
                                    "another key")
        return int(self._first_rows[index]) + row, batch.slice(row, 1)

    def close(self) -> None:
        self.keys.close()

