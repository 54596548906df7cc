"""One bounded read over several partitions, in partition order, each in offset order, moving its owner's
positions as it hands batches or messages out."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Iterator, MutableMapping
from types import TracebackType

import pyarrow as pa

from readers.batches import take_rows
from readers.partition_read import PartitionRead, open_partition_read
from readers.positions import Position, Resume
from storage import Message, Store
from storage.errors import LedgerviewError, UnknownPartitionError
from storage.readable import ReadableStore
from storage.remote_store import RemoteStore, is_remote_location
from storage.schema import messages_from_table

StoreOrPath = Store | RemoteStore | str | os.PathLike[str]
"""A store, a data folder's path, or a remote tier's URI (``s3://bucket/prefix``: read from the remote tier alone)."""


def open_store(store: StoreOrPath) -> tuple[ReadableStore, bool]:
    """The store to read and whether the reader owns it (opened it from a path or URI, so closes it)."""
    if isinstance(store, Store | RemoteStore):
        return store, False
    if is_remote_location(store):
        return RemoteStore.open(str(store)), True
    return Store.open_for_reading(store), True


def open_local_store(store: StoreOrPath, role: str) -> tuple[Store, bool]:
    """As ``open_store``, for a ``role`` that keeps state in the data folder and so cannot use a remote tier alone."""
    if isinstance(store, RemoteStore) or (not isinstance(store, Store) and is_remote_location(store)):
        raise LedgerviewError(f"A {role} keeps its state in a data folder; a remote tier alone ({store}) can be read "
                              "with Reader and TableView. Give the data folder (its remote tier is read through it).")
    if isinstance(store, Store):
        return store, False
    return Store.open(store), True


def chosen_partitions(store: ReadableStore, topic: str, partitions: Iterable[int] | None) -> list[int]:
    """Every partition of the topic, or the given ones, checked to exist (UnknownPartitionError otherwise)."""
    count = store.topic_metadata(topic).partitions
    chosen = list(range(count)) if partitions is None else sorted(set(partitions))
    for partition in chosen:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
            raise UnknownPartitionError(topic, partition, count)
    return chosen


class TopicRead(Iterator[pa.RecordBatch]):
    """Iterates MESSAGE_SCHEMA batches; after each one the owner's position of that partition is just past it,
    and once a partition is exhausted it is that partition's end offset (so the next read starts there).

    All partition reads are opened together when the read starts (ledgers first, then end offsets), so the read
    is one consistent cut of the topic. Closing it (or reaching its end) releases the ledgers.
    """

    def __init__(self, reads: list[PartitionRead], positions: MutableMapping[int, Position], *,
                 max_messages: int | None = None) -> None:
        self._reads = reads
        self._positions = positions
        self._max_messages = max_messages
        self._current: tuple[int, int | None] = (-1, None)
        self._batches = self._run()

    @classmethod
    def open(cls, store: ReadableStore, topic: str, positions: MutableMapping[int, Position], *, read_compacted: bool,
             max_messages: int | None = None) -> TopicRead:
        reads: list[PartitionRead] = []
        try:
            for partition, position in positions.items():
                reads.append(open_partition_read(store, topic, partition, position, read_compacted=read_compacted))
        except BaseException:
            for read in reads:
                read.close()
            raise
        return cls(sorted(reads, key=lambda read: read.partition), positions, max_messages=max_messages)

    @property
    def reads(self) -> list[PartitionRead]:
        return self._reads

    @property
    def current(self) -> tuple[int, int | None]:
        """(partition, source ledger id) of the batch handed out last."""
        return self._current

    def __iter__(self) -> TopicRead:
        return self

    def __next__(self) -> pa.RecordBatch:
        return next(self._batches)

    def _run(self) -> Generator[pa.RecordBatch, None, None]:
        remaining = self._max_messages
        try:
            for read in self._reads:
                ledger_id = read.source_ledger_id
                for stored in read.batches():
                    if remaining is not None and remaining <= 0:
                        return
                    batch = take_rows(stored, remaining)
                    if remaining is not None:
                        remaining -= batch.num_rows
                    last_offset = int(batch.column("offset")[batch.num_rows - 1].as_py())
                    self._positions[read.partition] = Resume(last_offset + 1, ledger_id)
                    self._current = (read.partition, ledger_id)
                    yield batch
                    if batch.num_rows < stored.num_rows:
                        return  # max_messages cut the batch: the partition's rest is the next read's
                self._positions[read.partition] = Resume(read.end_offset, ledger_id)
                read.close()
        finally:
            self._close_reads()

    def messages(self) -> Iterator[Message]:
        """The same read as Message objects (converted per batch); a message counts as read once handed out."""
        for batch in self:
            partition, ledger_id = self._current
            for message in messages_from_table(pa.Table.from_batches([batch])):
                self._positions[partition] = Resume(message.offset + 1, ledger_id)
                yield message

    def close(self) -> None:
        self._batches.close()
        self._close_reads()

    def _close_reads(self) -> None:
        for read in self._reads:
            read.close()

    def __enter__(self) -> TopicRead:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
