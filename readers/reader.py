"""Reader: a non-durable reader of a topic's raw or compacted view (Pulsar's Reader with ``readCompacted``).

Each iteration (``for message in reader``) or ``batches()`` call is one *bounded* read: it opens every partition
(the compacted ledger first, then the end offset), reads from the reader's position up to those end offsets, in
partition order and offset order within a partition, and stops. Messages appended meanwhile are left for the next
read, which continues where this one stopped; ``seek`` moves the position. Nothing is stored on disk: durable
positions are what Consumer adds.

The read rules (compacted view, start positions, continuation) are in readers/partition_read.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType

import pyarrow as pa

from readers.errors import InvalidPositionError, ReaderClosedError
from readers.positions import Position, Resume, StartPosition, positions_per_partition
from readers.topic_read import StoreOrPath, TopicRead, chosen_partitions, open_store
from storage import MESSAGE_SCHEMA, Message


class Reader:
    """Reads ``topic`` from ``start`` ('earliest', 'latest', an int offset, Timestamp(ms), or a dict from
    partition to one of those; partitions a dict leaves out start at the earliest).

    ``read_compacted``: serve the compacted view (the latest live message per key up to the compaction horizon,
    then every raw message above it) instead of the raw log. ``partitions``: read only these (default: all).

    Starts, per partition. Raw view: 'earliest' is the log start; an offset must lie in [log start, end offset]
    (else OffsetOutOfRangeError); Timestamp(t) is Kafka's offsetsForTimes (the first offset whose timestamp is
    >= t; the end offset if none); 'latest' is the end offset. Compacted view: 'earliest' is the whole ledger,
    even when retention removed its raw segments; an offset at or below the horizon starts at the first ledger
    message at or after it (raw data need not exist), above the horizon it is a raw offset; Timestamp(t) is the
    first ledger message with timestamp >= t, else the first raw message above the horizon with timestamp >= t,
    else the end; everything after the start is then served. Exact rules: readers/partition_read.py.
    ``store``: a Store (left open) or the path of a data folder (opened here and closed by ``close``).
    """

    def __init__(self, store: StoreOrPath, topic: str, *, read_compacted: bool = False,
                 start: StartPosition = "earliest", partitions: Iterable[int] | None = None) -> None:
        self._store, self._owns_store = open_store(store)
        try:
            self.topic = topic
            self.read_compacted = read_compacted
            self.partitions = chosen_partitions(self._store, topic, partitions)
            self._positions: dict[int, Position] = positions_per_partition(start, self.partitions)
        except BaseException:
            self._close_store()
            raise
        self._read: TopicRead | None = None
        self._closed = False

    def batches(self) -> TopicRead:
        """Start a bounded read and return its batches (pyarrow RecordBatch, MESSAGE_SCHEMA), zero-copy where
        stored. The read's cut (ledgers, end offsets) is taken now, not at the first ``next``."""
        return self._open()

    def __iter__(self) -> Iterator[Message]:
        """Start a bounded read of Message objects (converted per batch)."""
        return self._open().messages()

    def seek(self, position: StartPosition) -> None:
        """Move every partition read (or only those a dict names) to ``position``; ends a read in progress."""
        self._end_read()
        self._positions.update(positions_per_partition(position, self._dict_partitions(position)))

    @property
    def positions(self) -> dict[int, int]:
        """The next offset of each partition that has been read (a start not yet resolved is left out)."""
        return {p: position.offset for p, position in self._positions.items() if isinstance(position, Resume)}

    def close(self) -> None:
        """End a read in progress and release the store when this reader opened it."""
        if not self._closed:
            self._closed = True
            self._end_read()
            self._close_store()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _open(self) -> TopicRead:
        if self._closed:
            raise ReaderClosedError("Reader")
        self._end_read()  # one read at a time: a new read starts where the previous one stopped
        self._read = TopicRead.open(self._store, self.topic, self._positions, read_compacted=self.read_compacted)
        return self._read

    def _end_read(self) -> None:
        if self._read is not None:
            self._read.close()
            self._read = None

    def _dict_partitions(self, position: StartPosition) -> list[int]:
        if not isinstance(position, Mapping):
            return self.partitions
        unknown = sorted(set(position) - set(self.partitions))
        if unknown:
            raise InvalidPositionError(position, f"it names partitions {unknown} this reader does not read")
        return list(position)

    def _close_store(self) -> None:
        if self._owns_store:
            self._store.close()


def read_table(store: StoreOrPath, topic: str, *, read_compacted: bool = False,
               start: StartPosition = "earliest") -> pa.Table:
    """One bounded read of the whole topic as one table (MESSAGE_SCHEMA); a convenience for small topics."""
    with Reader(store, topic, read_compacted=read_compacted, start=start) as reader:
        return pa.Table.from_batches(list(reader.batches()), schema=MESSAGE_SCHEMA)
