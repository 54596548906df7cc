"""Idempotent producers' state of one partition, kept beside its segments so that a batch a producer retries after
the writing process was killed is still recognised (Kafka's ProducerStateManager).

For each producer id: its epoch, when it last appended, and its last five batches (first and last sequence,
first and last offset). Kafka rebuilds this from the producer fields of its stored batches; ledgerview's batches
do not carry them, so two files in the partition folder do:

- ``producer-state.journal``: one line per batch an idempotent producer appends, a compact ``producer-batch``
  record (storage/records.py: JSON with a CRC-32C), written **before** the batch is written to its segment. A
  line whose last offset is not below the log end offset when the state is loaded is a batch the crash stopped
  before it was written, and is dropped.
- ``producer-state.snapshot``: a ``producer-snapshot`` record, the whole state as of an offset, written
  atomically when the state is loaded, after a roll, when the journal passes JOURNAL_ENTRIES_MAX lines and on
  a clean close; the journal then starts empty. Journal lines below the snapshot's offset are ignored.

What is durable when: a killed process loses nothing (the journal line is in the page cache before the batch is).
Against a power loss, the journal is fsynced (``sync``) before every fsync of the log that moves its recovery
point (a flush by flush.messages or flush.ms, a periodic or explicit flush, a roll, closing the store: the owner
registers ``sync`` with PartitionLog.register_before_fsync), never per batch; snapshots are fsynced when written.
So every batch below the recovery point has its state on disk. A batch above it that the kernel happened to write
back before its journal line can survive a power loss without it, and a retry of it is then stored again.

Loading takes the snapshot, then the journal lines above its offset and below the log end offset, in order; a
damaged line is skipped with a warning (the batches it named may then be stored again if retried), a torn last
line is a crash mid-write. Producers idle for longer than ``producer.id.expiration.ms`` are dropped at a snapshot.
The caller holds the partition's writer lock for every call.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections import deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from storage import faults
from storage.fileio import write_atomically
from storage.records import CorruptRecordError, decode_record, encode_record

log = logging.getLogger(__name__)

JOURNAL = "producer-state.journal"
SNAPSHOT = "producer-state.snapshot"
BATCH_RECORD, SNAPSHOT_RECORD, VERSION = "producer-batch", "producer-snapshot", 1
BATCHES_REMEMBERED = 5
"""Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN: a producer has at most five batches in flight."""
JOURNAL_ENTRIES_MAX = 1000
PRODUCER_ID_EXPIRATION_MS = 86400000
"""Kafka's ``producer.id.expiration.ms`` default (one day)."""
SEQUENCE_MAX = 2**31 - 1


@dataclass(frozen=True)
class ProducerBatch:
    """One batch an idempotent producer appended: its producer id and epoch, sequences and offsets."""

    producer_id: int
    epoch: int
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    written_ms: int

    def followed_by(self, epoch: int, first_sequence: int) -> bool:
        """Whether a batch of ``epoch`` starting at ``first_sequence`` is the next one after this."""
        return epoch == self.epoch and first_sequence == _following(self.last_sequence)


class Verdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    """The batch was appended before: answer success with its first offset (Kafka's DUPLICATE_SEQUENCE_NUMBER
    handling)."""
    OUT_OF_ORDER = "out of order"
    """Its first sequence does not follow the producer's last one (OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    FENCED = "fenced"
    """Its epoch is older than the producer's (INVALID_PRODUCER_EPOCH)."""


@dataclass
class _Producer:
    epoch: int
    written_ms: int
    batches: deque[ProducerBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_REMEMBERED))


def last_sequence(first_sequence: int, count: int) -> int:
    """The sequence of the last of ``count`` messages from ``first_sequence``, wrapping past 2^31-1 as Kafka."""
    return (first_sequence + count - 1) % (SEQUENCE_MAX + 1)


class ProducerState:
    """The producer state of the partition folder ``folder``; see the module docstring."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._producers: dict[int, _Producer] = {}
        self._journal_lines = 0
        self._journal_unsynced = False
        self._fd = -1

    @classmethod
    def load(cls, folder: Path, *, end_offset: int, now_ms: int) -> ProducerState:
        """The state of ``folder`` whose log ends at ``end_offset`` now, rewritten as a fresh snapshot."""
        state = cls(folder)
        snapshot_offset = state._read_snapshot()
        for batch in state._read_journal():
            if snapshot_offset <= batch.first_offset and batch.last_offset < end_offset:
                state._remember(batch)
        state._fd = os.open(folder / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        state.snapshot(end_offset, now_ms)
        return state

    def check(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int) -> (
        tuple[Verdict, int | None]
    ):
        """Kafka's checks of a batch from an idempotent producer, and the first offset of its earlier copy for a
        DUPLICATE. A producer with no state (new, or expired) may start at any sequence."""
        producer = self._producers.get(producer_id)
        if producer is None:
            return Verdict.APPEND, None
        if epoch < producer.epoch:
            return Verdict.FENCED, None
        if epoch > producer.epoch:
            return (Verdict.APPEND if first_sequence == 0 else Verdict.OUT_OF_ORDER), None
        for batch in producer.batches:
            if (batch.first_sequence, batch.last_sequence) == (first_sequence, last_sequence):
                return Verdict.DUPLICATE, batch.first_offset
        follows = producer.batches[-1].followed_by(epoch, first_sequence) if producer.batches else True
        return (Verdict.APPEND if follows else Verdict.OUT_OF_ORDER), None

    def begin(self, batches: list[ProducerBatch]) -> int:
        """Write ``batches`` to the journal before they are appended to the log; returns the journal's length
        before, for ``abandon`` if the append fails."""
        before = os.lseek(self._fd, 0, os.SEEK_END)
        lines = [_compact(encode_record(BATCH_RECORD, VERSION, _batch_body(batch))) for batch in batches]
        os.write(self._fd, b"".join(lines))
        self._journal_unsynced = True
        faults.crash_point("producer_state.after_journal")
        self._journal_lines += len(lines)
        return before

    def abandon(self, journal_bytes: int) -> None:
        """Cut the journal back to ``journal_bytes``: the batches begun were not appended."""
        os.ftruncate(self._fd, journal_bytes)
        self._journal_unsynced = True
        self._journal_lines = -1  # unknown now; the next commit snapshots

    def commit(self, batches: list[ProducerBatch], *, end_offset: int, rolled: bool) -> None:
        """Remember ``batches``, appended now (the log ends at ``end_offset``); snapshot after a roll or when the
        journal is long."""
        for batch in batches:
            self._remember(batch)
        if rolled or not 0 <= self._journal_lines < JOURNAL_ENTRIES_MAX:
            self.snapshot(end_offset, max(batch.written_ms for batch in batches))

    def snapshot(self, end_offset: int, now_ms: int) -> None:
        """Write the whole state as of ``end_offset`` (producers idle past producer.id.expiration.ms dropped) and
        empty the journal."""
        self._producers = {producer_id: producer for producer_id, producer in self._producers.items()
                           if now_ms - producer.written_ms <= PRODUCER_ID_EXPIRATION_MS}
        body = {"offset": end_offset,
                "batches": [_batch_body(batch) for producer in self._producers.values() for batch in producer.batches]}
        write_atomically(self.folder / SNAPSHOT, encode_record(SNAPSHOT_RECORD, VERSION, body))
        os.ftruncate(self._fd, 0)
        self._journal_lines = 0
        self._journal_unsynced = False  # the snapshot, fsynced, holds every line; lines that reappear are below it

    def sync(self) -> None:
        """fsync the journal if lines were written since the last sync or snapshot. The partition log calls this
        before each of its fsyncs (PartitionLog.register_before_fsync), so the lines of the batches it makes
        durable are durable first."""
        if self._journal_unsynced and self._fd >= 0:
            os.fsync(self._fd)
            self._journal_unsynced = False

    def close(self, end_offset: int, now_ms: int) -> None:
        """Snapshot (a clean shutdown) and close the journal."""
        if self._fd >= 0:
            self.snapshot(end_offset, now_ms)
            self.close_journal()

    def close_journal(self) -> None:
        """Close the journal without a snapshot: for a state whose log is gone (its topic deleted, maybe created
        anew in the same folder), which must not be used after."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _remember(self, batch: ProducerBatch) -> None:
        producer = self._producers.get(batch.producer_id)
        if producer is None or producer.epoch != batch.epoch:
            producer = self._producers[batch.producer_id] = _Producer(batch.epoch, batch.written_ms)
        producer.written_ms = max(producer.written_ms, batch.written_ms)
        producer.batches.append(batch)

    def _read_snapshot(self) -> int:
        path = self.folder / SNAPSHOT
        try:
            _, body = decode_record(path, path.read_bytes(), SNAPSHOT_RECORD, max_version=VERSION)
            batches = [_batch(entry) for entry in body["batches"]]
            offset = int(body["offset"])
        except FileNotFoundError:
            return 0
        except (CorruptRecordError, KeyError, TypeError, ValueError) as error:
            log.warning("ignoring the producer state snapshot %s (%s): retries of batches idempotent producers "
                        "sent before it may be stored again", path, error)
            return 0
        for batch in batches:
            self._remember(batch)
        return offset

    def _read_journal(self) -> list[ProducerBatch]:
        path = self.folder / JOURNAL
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        batches = []
        lines = data.split(b"\n")
        for number, line in enumerate(lines[:-1], 1):  # the last piece has no newline: a torn write, or empty
            try:
                batches.append(_batch(decode_record(path, line, BATCH_RECORD, max_version=VERSION)[1]))
            except (CorruptRecordError, KeyError, TypeError, ValueError) as error:
                log.warning("skipping line %d of the producer state journal %s (%s): a retry of the batch it "
                            "named may be stored again", number, path, error)
        return batches


def _following(sequence: int) -> int:
    return 0 if sequence == SEQUENCE_MAX else sequence + 1


def _compact(record: bytes) -> bytes:
    """A record on one line (its checksum covers the body, not the layout)."""
    return json.dumps(json.loads(record), separators=(",", ":")).encode() + b"\n"


_FIELDS = tuple(entry.name for entry in fields(ProducerBatch))


def _batch_body(batch: ProducerBatch) -> dict[str, int]:
    return {name: getattr(batch, name) for name in _FIELDS}


def _batch(body: dict[str, Any]) -> ProducerBatch:
    return ProducerBatch(**{name: int(body[name]) for name in _FIELDS})
