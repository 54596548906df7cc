"""The ingest worker: moves one source's messages into its topic exactly once, across crashes and restarts.

Every message carries a header ``ledgerview.source.<name>`` whose value is its sequence number in that source
(decimal), and the worker chooses its partition itself: Kafka's murmur2 of the key as the store would, and
``sequence mod partitions`` for keyless messages, so that a replayed message goes where it went the first time.
The worker's checkpoint (``<data>/__service/sources/<name>.json``, replaced atomically) holds the source position
and sequence number of the next read and the topic's end offsets, all as of the last flush.

Steady state, on the worker's own thread and Store:

1. Read the next batch from the source at the current position (nothing new: pause ``interval_s``).
2. Append it with its sequence headers and partitions. The store writes each partition's share in sequence order,
   so a crash here leaves, in each partition, a prefix of the batch's share of that partition.
3. Every ``flush_interval_s``: fsync the topic (recovery points move), then write the checkpoint. A crash
   between appends and this write leaves appended messages the checkpoint does not cover; recovery finds them.

Recovery, when the worker starts:

1. Read the checkpoint (none: the source's initial position, sequence 0, every partition from its log start).
2. Read the sequence headers of this source in every partition from the checkpoint's end offsets on, and keep
   the highest of each partition: in a partition, every message of this source up to that sequence is there
   (step 2 above), even if the in-place cleaner has since removed some that later ones superseded.
3. Replay the source from the checkpoint position up to the highest sequence found in any partition, appending
   only the messages above the highest sequence of their partition. Nothing is appended twice, nothing is
   skipped, and each partition keeps its messages in source order.
4. Flush and write the checkpoint; then the steady state.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.errors import SourceReplayError
from ledgerview.refusals import partition_lacking, store_refusal
from ledgerview.service.logs import log_event
from ledgerview.service.sources import Position, Source, SourceBatch
from storage import Store, faults
from storage.errors import CorruptDataError, KeylessMessageError, MessageTooLargeError
from storage.fileio import write_atomically
from storage.partitioner import partition_for_keys
from storage.periodic import BackgroundThread
from storage.records import is_count
from storage.schema import HEADER_TYPE

SERVICE_FOLDER = "__service"
SEQUENCE_HEADER_PREFIX = "ledgerview.source."
CHECKPOINT_VERSION = 1
IDLE_WAIT_S = 0.05
"""Shortest pause when a source has nothing new, whatever its interval_s."""
logger = logging.getLogger("ledgerview.ingest")


@dataclass(frozen=True)
class SourceCheckpoint:
    """Where a source's ingest stood at its last flush."""

    position: Position
    """The source position of the next read."""
    next_sequence: int
    """The sequence number the next read's first message gets."""
    end_offsets: list[int] | None
    """The topic's end offset per partition when it was written; None: read every partition from its start."""

    def encode(self) -> bytes:
        return json.dumps({"version": CHECKPOINT_VERSION, "position": self.position,
                           "next_sequence": self.next_sequence, "end_offsets": self.end_offsets}).encode()


@dataclass
class IngestStats:
    """What the status endpoint and metrics show of one worker; written by the worker thread only."""

    state: str = "starting"
    messages: int = 0
    appends: int = 0
    recovered_messages: int = 0
    last_append_ms: int | None = None
    last_error: str | None = None
    next_sequence: int = 0
    errors: int = 0


def checkpoint_path(data: Path, source_name: str) -> Path:
    return data / SERVICE_FOLDER / "sources" / f"{source_name}.json"


def sequence_header_key(source_name: str) -> str:
    return SEQUENCE_HEADER_PREFIX + source_name


class CorruptSourceCheckpointError(CorruptDataError):
    """A source checkpoint that is not what the worker writes."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"Source checkpoint {path}: {problem}. The source stopped; remove it to read the source "
                         "again from its start (recovery then appends only what the topic lacks, by the sequence "
                         "headers).")


def read_checkpoint(path: Path, kind: Position) -> SourceCheckpoint | None:
    """The checkpoint at ``path``, None when there is none; raises CorruptSourceCheckpointError when it is not one
    of a source whose positions have the keys of ``kind``."""
    try:
        record = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise CorruptSourceCheckpointError(path, f"it is not JSON ({error})") from None
    if not isinstance(record, dict) or set(record) != {"version", "position", "next_sequence", "end_offsets"}:
        raise CorruptSourceCheckpointError(path, "it does not hold version, position, next_sequence and end_offsets")
    position, sequence, ends = record["position"], record["next_sequence"], record["end_offsets"]
    if not isinstance(position, dict) or set(position) != set(kind):
        raise CorruptSourceCheckpointError(path, f"its position {position!r} is not one of this source (whose "
                                           f"positions have the keys {', '.join(kind)})")
    for key, example in kind.items():
        value = position[key]
        if not isinstance(value, type(example)) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise CorruptSourceCheckpointError(path, f"its position's {key} {value!r} is not a "
                                               f"{'count' if isinstance(example, int) else type(example).__name__}")
    if not is_count(sequence):
        raise CorruptSourceCheckpointError(path, "next_sequence is not a count")
    if ends is not None and not (isinstance(ends, list) and all(is_count(end) for end in ends)):
        raise CorruptSourceCheckpointError(path, "end_offsets is not a list of offsets")
    return SourceCheckpoint(position, sequence, ends)


def with_sequence_headers(messages: pa.Table, source_name: str, first_sequence: int) -> pa.Table:
    """The messages with one header each, ``ledgerview.source.<name>`` = its sequence number; columnar."""
    count = messages.num_rows
    keys = pa.array([sequence_header_key(source_name)], pa.string()).take(pa.array(np.zeros(count, np.int32)))
    values = pa.array(np.arange(first_sequence, first_sequence + count, dtype=np.int64)).cast(pa.string())
    pairs = pa.StructArray.from_arrays([keys, values.cast(pa.binary())], fields=list(HEADER_TYPE.value_type))
    headers = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32)), pairs, type=HEADER_TYPE)
    return messages.append_column("headers", headers)


def with_partitions(messages: pa.Table, partitions: int, first_sequence: int) -> pa.Table:
    """The messages with a partition column: the one a JSON line gives (``partition``), else murmur2 of the key
    for keyed ones (where the store would put them), sequence number mod ``partitions`` for keyless ones. Always
    the same for the same message, so a replayed file lands where it did."""
    keys = messages.column("key").combine_chunks()
    chosen = (np.arange(first_sequence, first_sequence + messages.num_rows) % partitions).astype(np.int32)
    keyed = np.flatnonzero(keys.is_valid().to_numpy(zero_copy_only=False))
    if len(keyed):
        chosen[keyed] = partition_for_keys(keys.take(pa.array(keyed)), partitions)
    if "partition" not in messages.column_names:
        return messages.append_column("partition", pa.array(chosen, pa.int32()))
    given = messages.column("partition").combine_chunks()
    return messages.set_column(messages.schema.get_field_index("partition"), "partition",
                               pc.if_else(given.is_valid(), given.cast(pa.int32()), pa.array(chosen, pa.int32())))


def read_sequences(store: Store, topic: str, source_name: str, from_offsets: list[int] | None) -> (
    dict[int, np.ndarray]
):
    """Per partition, the sequence numbers of this source's messages from ``from_offsets`` on (None: from the log
    start), in offset order."""
    wanted = pa.scalar(sequence_header_key(source_name), pa.string())
    found: dict[int, np.ndarray] = {}
    for partition in range(store.topic_metadata(topic).partitions):
        start = None if from_offsets is None or partition >= len(from_offsets) else from_offsets[partition]
        start = None if start is None else max(start, store.start_offset(topic, partition))
        parts = [np.empty(0, np.int64)]
        for batch in store.read_batches(topic, partition, start):
            pairs = batch.column("headers").flatten()
            values = pairs.field("value").filter(pc.equal(pairs.field("key"), wanted))
            if len(values):
                parts.append(values.cast(pa.string()).cast(pa.int64()).to_numpy())
        found[partition] = np.concatenate(parts)
    return found


class IngestWorker(BackgroundThread):
    """One source feeding one topic on a thread of its own (with a Store of its own). Stopping finishes the append
    in progress, flushes and writes the final checkpoint."""

    def __init__(self, source: Source, data: Path, *, interval_s: float, flush_interval_s: float,
                 kind: str) -> None:
        super().__init__(f"ledgerview-source-{source.name}")
        self.source = source
        self.data = data
        self.interval_s = interval_s
        self.flush_interval_s = flush_interval_s
        self.kind = kind
        self.stats = IngestStats()
        self._checkpoint_path = checkpoint_path(data, source.name)
        self._position: Position = source.initial_position()
        self._next_sequence = 0

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def topic(self) -> str:
        return self.source.topic

    def run(self) -> None:
        try:
            with Store.open(self.data) as store:
                self._recover(store)
                self.stats.state = "running"
                last_flush = time.monotonic()
                while not self.stopping.is_set():
                    limit = store.topic_metadata(self.source.topic).config.max_message_bytes
                    batch = self.source.read(self._position, limit)
                    if batch is not None and batch.messages.num_rows:
                        self._append(store, batch)
                    if batch is not None:
                        self._position = batch.next_position
                    if time.monotonic() - last_flush >= self.flush_interval_s:
                        self._flush(store)
                        last_flush = time.monotonic()
                    else:
                        store.flush_due()  # a topic's own flush.ms may be shorter than the service's interval
                    if batch is None or not batch.more:
                        self.stopping.wait(self.interval_s if batch is not None else max(self.interval_s, IDLE_WAIT_S))
                self._flush(store)
                self.stats.state = "stopped"
        except Exception as error:  # the source stops; the service and the other sources go on
            self.stats.state = "failed"
            self.stats.errors += 1
            self.stats.last_error = f"{type(error).__name__}: {error}"
            log_event(logger, logging.ERROR, "source.failed", source=self.source.name, topic=self.source.topic,
                      error=self.stats.last_error)

    def _stamped(self, messages: pa.Table, partitions: int) -> pa.Table:
        """The messages with their sequence headers and partitions (of a topic with ``partitions``), numbered from
        the next sequence number."""
        table = with_sequence_headers(messages, self.source.name, self._next_sequence)
        return with_partitions(table, partitions, self._next_sequence)

    def _append(self, store: Store, batch: SourceBatch) -> None:
        """Append the batch whole, or raise the source's error naming its first message the topic refuses (a
        partition it lacks, over max.message.bytes, keyless for a compact topic) with nothing of it written."""
        messages = batch.messages
        partitions = store.topic_metadata(self.source.topic).partitions
        table = self._stamped(messages, partitions)
        named = table.column("partition").to_numpy()
        beyond = np.flatnonzero(named >= partitions)
        if len(beyond):
            raise self.source.refused(batch, int(beyond[0]), partition_lacking(named[beyond[0]], self.source.topic,
                                                                               partitions))
        try:
            store.append(self.source.topic, table)
        except (MessageTooLargeError, KeylessMessageError) as error:
            raise self.source.refused(batch, error.row, store_refusal(error)) from None
        self._next_sequence += messages.num_rows
        self.stats.messages += messages.num_rows
        self.stats.appends += 1
        self.stats.next_sequence = self._next_sequence
        self.stats.last_append_ms = store.clock()

    def _flush(self, store: Store) -> None:
        store.flush(self.source.topic)
        faults.crash_point("ingest.before_checkpoint")
        partitions = store.topic_metadata(self.source.topic).partitions
        ends = [store.end_offset(self.source.topic, partition) for partition in range(partitions)]
        self._checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self._checkpoint_path, SourceCheckpoint(self._position, self._next_sequence, ends).encode())

    def _recover(self, store: Store) -> None:
        """Recovery steps 1 to 4 of the module doc."""
        checkpoint = read_checkpoint(self._checkpoint_path, self.source.initial_position())
        if checkpoint is not None:
            self._position, self._next_sequence = checkpoint.position, checkpoint.next_sequence
        found = read_sequences(store, self.source.topic, self.source.name,
                                 checkpoint.end_offsets if checkpoint else None)
        highest = np.array([int(found[p].max()) if len(found[p]) else -1 for p in sorted(found)], np.int64)
        replayed = skipped = 0
        while self._next_sequence <= int(highest.max(initial=-1)):
            batch = self.source.read(self._position, store.topic_metadata(self.source.topic).config.max_message_bytes)
            if batch is None:
                raise SourceReplayError(self.source.name, self._position, int(highest.max()))
            table = self._stamped(batch.messages, store.topic_metadata(self.source.topic).partitions)
            sequences = np.arange(self._next_sequence, self._next_sequence + table.num_rows)
            missing = sequences > highest[table.column("partition").to_numpy()]
            if missing.any():
                store.append(self.source.topic, table.filter(pa.array(missing)))
            replayed += int(missing.sum())
            skipped += int((~missing).sum())
            self._next_sequence += table.num_rows
            self._position = batch.next_position
        self.stats.recovered_messages = replayed
        self.stats.next_sequence = self._next_sequence
        self._flush(store)
        log_event(logger, logging.INFO, "source.recovered", source=self.source.name, topic=self.source.topic,
                  next_sequence=self._next_sequence, appended_again=replayed, already_present=skipped)
