"""Fetch read-ahead: what a consumer's next Fetch will ask for, read and encoded while it handles the last one.

A Kafka consumer keeps one Fetch in flight per broker and sends the next only once it has the last response, from
the offset after its last message, with the same sizes. So without read-ahead the endpoint's work (reading,
selecting, encoding) and the client's (decoding) take turns. Once a Fetch whose partition reads stopped at their
byte budget is written, the connection reads each of those partitions on from where it stopped, as that next
Fetch would (ledgerview/kafka/fetch.py), keeps the reads here and encodes their batches into the fetch cache while
the client says nothing (response_sender.py). The next Fetch takes a kept read only if it asks for exactly that
read (topic, partition, offset, byte budget); it then serves the kept batches, whose encodings the cache holds.

Only reads of the raw log are kept; the compacted view's are encoded ahead and read again (its reads span a
ledger a compaction may replace and a raw tail, which this check does not cover). A kept read is served only if
its topic is the same one (not deleted and created again since) and the log start has not passed its offset
(retention, DeleteRecords); otherwise the Fetch reads again, and so gets OFFSET_OUT_OF_RANGE. It is served with the
partition's current high-water mark and log start; its messages are those the log held when it was read, at most
KEEP_SECONDS before, as a Fetch a moment earlier would have got them (a message the cleaner has removed since may
be among them). It is dropped by the connection's next Fetch, when the connection closes, or after KEEP_SECONDS,
so a consumer that stops asking holds no files for long. Kafka needs none of this: its fetches send segment bytes
with sendfile, with no work per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ledgerview.kafka.fetch_response import PartitionAnswer, close_all

KEEP_SECONDS = 5.0
"""How long a read made ahead is kept for the Fetch it was made for."""


@dataclass(frozen=True)
class NextRead:
    """A partition read a consumer's next Fetch will likely ask for: a read that stopped at its byte budget, from
    where it stopped, with the same budget (``first``: the response's first partition with data, which gets at
    least one message)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    first: bool


@dataclass(frozen=True)
class KeptRead:
    answer: PartitionAnswer
    closers: list[Callable[[], None]]
    """What close the files ``answer`` reads from."""
    topic_created_ms: int
    """The creation time of the topic it was read from (TopicView.created_ms)."""


class KeptReads:
    """The reads a connection made ahead; used on the endpoint's event loop only."""

    def __init__(self) -> None:
        self._reads: dict[NextRead, KeptRead] = {}
        self._expiry: asyncio.TimerHandle | None = None

    def keep(self, read: NextRead, kept: KeptRead) -> None:
        """Keep ``kept``, read for ``read``, until it is taken or dropped."""
        previous = self._reads.pop(read, None)
        if previous is not None:
            close_all(previous.closers)
        self._reads[read] = kept
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(KEEP_SECONDS, self.drop)

    def take(self, read: NextRead) -> KeptRead | None:
        """The read kept for exactly ``read``, now the caller's to close; None if none is."""
        return self._reads.pop(read, None)

    def drop(self) -> None:
        """Close every kept read."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        reads, self._reads = self._reads, {}
        for kept in reads.values():
            close_all(kept.closers)
