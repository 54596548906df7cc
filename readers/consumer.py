"""Consumer: a durable subscription on a topic's raw or compacted view, with cumulative acknowledgements.

The subscription's position per partition is a cursor record (storage/cursors.py). As in Pulsar, the subscription
exists from its first open: the initial position is resolved then and stored, so a consumer that reopens without
having acknowledged anything starts where the subscription was created, not at a new "latest".

Reading is Reader's bounded read (readers/partition_read.py), from the in-memory position: received messages are
not received again by this consumer, acknowledged or not. A consumer that reopens starts after the last
acknowledgement: unacknowledged messages are delivered again (at-least-once).

Acknowledgements are cumulative and never move back. Any offset below the end offset may be acknowledged,
including one that now exists only in the compacted ledger because retention removed its raw segment: refusing it
would leave the subscription stuck (Pulsar PR #25998).

One consumer per subscription at a time (Pulsar's exclusive subscription); two consumers of one subscription in
different processes are not fenced off from each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from readers.errors import AcknowledgementOutOfRangeError, ReaderClosedError
from readers.partition_read import open_partition_read
from readers.positions import Position, Resume, StartPosition, positions_per_partition
from readers.topic_read import StoreOrPath, TopicRead, chosen_partitions, open_local_store
from storage import Message
from storage.cursors import (
    SubscriptionCursor,
    read_subscription_cursor,
    validate_subscription_name,
    write_subscription_cursor,
)


class Consumer:
    """Consumes ``topic`` through the durable subscription ``subscription``.

    ``initial_position``: where a new subscription starts ('earliest', 'latest', or any Reader start position);
    ignored when the subscription exists. ``read_compacted``: consume the compacted view. ``store``: a Store (left
    open) or the path of a data folder (opened here, closed by ``close``).
    """

    def __init__(self, store: StoreOrPath, topic: str, subscription: str, *, read_compacted: bool = False,
                 initial_position: StartPosition = "earliest", partitions: Iterable[int] | None = None) -> None:
        self.subscription = validate_subscription_name(subscription)
        self._store, self._owns_store = open_local_store(store, "Consumer (a durable subscription)")
        self.topic = topic
        self.read_compacted = read_compacted
        self._read: TopicRead | None = None
        self._sessions: dict[int, list[tuple[int, int | None]]] = {}
        """Per partition, (first offset, source ledger id) of each read since the last acknowledgement."""
        self._closed = False
        try:
            self.partitions = chosen_partitions(self._store, topic, partitions)
            initial = positions_per_partition(initial_position, self.partitions)
            self._created: set[int] = set()
            self._acked = {p: self._read_or_create(p, initial[p]) for p in self.partitions}
        except BaseException:
            self._close_store()
            raise
        # a stored position is an acknowledgement (messages above it may have been received), unless this
        # consumer just created the subscription there
        self._positions: dict[int, Position] = {
            p: Resume(cursor.acked_offset, cursor.ledger_id, acknowledged=p not in self._created)
            for p, cursor in self._acked.items()
        }

    # ---------------------------------------------------------------------------------------------- receiving
    def receive_batches(self, max_messages: int | None = None) -> TopicRead:
        """Start a bounded read of the messages after those received, at most ``max_messages`` of them (default:
        all there are now); batches of MESSAGE_SCHEMA."""
        return self._open(max_messages)

    def __iter__(self) -> Iterator[Message]:
        """The messages after those received, up to the end offsets now (a bounded read)."""
        return self._open(None).messages()

    # ---------------------------------------------------------------------------------------- acknowledgement
    def acknowledge_cumulative(self, message_or_partition: Message | int, offset: int | None = None) -> None:
        """Acknowledge every message of ``partition`` up to and including ``offset`` (or up to ``message``).

        Stored durably before returning. An acknowledgement at or below the stored one changes nothing.
        """
        if self._closed:
            raise ReaderClosedError("Consumer")
        if isinstance(message_or_partition, Message):
            partition, offset = message_or_partition.partition, message_or_partition.offset
        else:
            partition = message_or_partition
        if offset is None or isinstance(offset, bool) or partition not in self._acked:
            raise TypeError("acknowledge_cumulative takes a Message, or a partition this consumer reads and an "
                            f"offset; got {message_or_partition!r}, {offset!r}")
        end = self._store.end_offset(self.topic, partition)
        if not 0 <= offset < end:
            raise AcknowledgementOutOfRangeError(self.topic, partition, offset, end)
        folder = self._folder(partition)
        stored = read_subscription_cursor(folder, self.subscription, partition) or self._acked[partition]
        if offset + 1 <= stored.acked_offset:
            self._acked[partition] = stored
            return
        cursor = SubscriptionCursor(self.subscription, partition, offset + 1, self.read_compacted,
                                    self._ledger_of(partition, offset), self._store.clock())
        write_subscription_cursor(folder, cursor)
        self._acked[partition] = cursor

    @property
    def acknowledged(self) -> dict[int, int]:
        """Per partition, the next offset after the acknowledged ones (what a reopened consumer starts from)."""
        return {p: cursor.acked_offset for p, cursor in self._acked.items()}

    # ------------------------------------------------------------------------------------------------ closing
    def close(self) -> None:
        """End a read in progress and release the store when this consumer opened it; acknowledgements are
        already durable."""
        if not self._closed:
            self._closed = True
            self._end_read()
            self._close_store()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # --------------------------------------------------------------------------------------------- internals
    def _read_or_create(self, partition: int, initial: Position) -> SubscriptionCursor:
        """The stored cursor, or a new one at the resolved initial position, stored now."""
        folder = self._folder(partition)
        cursor = read_subscription_cursor(folder, self.subscription, partition)
        if cursor is not None:
            return cursor
        read = open_partition_read(self._store, self.topic, partition, initial, read_compacted=self.read_compacted)
        try:
            cursor = SubscriptionCursor(self.subscription, partition, read.start_offset, self.read_compacted,
                                        read.source_ledger_id, self._store.clock())
        finally:
            read.close()
        write_subscription_cursor(folder, cursor)
        self._created.add(partition)
        return cursor

    def _ledger_of(self, partition: int, offset: int) -> int | None:
        """The ledger the read that delivered ``offset`` served (the last read starting at or below it); None for
        the raw log or an offset this consumer did not receive: safe, since a reopened consumer then reads every
        version above its position rather than trust a ledger it may not have read."""
        sessions = self._sessions.get(partition, [])
        for start, ledger_id in reversed(sessions):
            if start <= offset:
                self._sessions[partition] = [session for session in sessions if session[0] >= start]
                return ledger_id
        return None

    def _open(self, max_messages: int | None) -> TopicRead:
        if self._closed:
            raise ReaderClosedError("Consumer")
        self._end_read()
        self._read = TopicRead.open(self._store, self.topic, self._positions, read_compacted=self.read_compacted,
                                    max_messages=max_messages)
        for read in self._read.reads:
            self._sessions.setdefault(read.partition, []).append((read.start_offset, read.source_ledger_id))
        return self._read

    def _end_read(self) -> None:
        if self._read is not None:
            self._read.close()
            self._read = None

    def _folder(self, partition: int) -> Path:
        return self._store.partition_log(self.topic, partition).folder

    def _close_store(self) -> None:
        if self._owns_store:
            self._store.close()

