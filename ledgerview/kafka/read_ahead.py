"""Fetch read-ahead: what a consumer's next Fetch will ask for, read and encoded while it handles the last one.

A Kafka consumer keeps one Fetch in flight per broker and sends the next only once it has the last response, from
the offset after its last message, with the same sizes. So without read-ahead the endpoint's work (reading,
selecting, encoding) and the client's (decoding) take turns. Once a Fetch whose partition reads stopped at their
byte budget is written, the connection reads each of those partitions on from where it stopped, as that next
Fetch would (ledgerview/kafka/fetch.py), keeps the reads here and encodes their batches into the fetch cache while
the client says nothing (response_sender.py). The next Fetch takes a kept read only if it asks for exactly that
read (topic, partition, offset, byte budget); it then serves the kept batches, whose encodings the cache holds.

A kept read is a snapshot of the log when it was read, as a Fetch response is: the offsets it serves hold the same
messages later, or none once retention or cleaning removed them. It is dropped by the connection's next Fetch,
when the connection closes, or after KEEP_SECONDS, so a consumer that stops asking holds no files for long.
Kafka needs none of this: its fetches send segment bytes with sendfile, with no work per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ledgerview.kafka.fetch_response import PartitionAnswer

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


class KeptReads:
    """The reads a connection made ahead, each with what closes it; used on the endpoint's event loop only."""

    def __init__(self) -> None:
        self._reads: dict[NextRead, tuple[PartitionAnswer, list[Callable[[], None]]]] = {}
        self._expiry: asyncio.TimerHandle | None = None

    def keep(self, read: NextRead, answer: PartitionAnswer, closers: list[Callable[[], None]]) -> None:
        """Keep ``answer``, read for ``read``, until it is taken or dropped (``closers`` close what it reads)."""
        previous = self._reads.pop(read, None)
        if previous is not None:
            _close(previous[1])
        self._reads[read] = (answer, closers)
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(KEEP_SECONDS, self.drop)

    def take(self, read: NextRead) -> tuple[PartitionAnswer, list[Callable[[], None]]] | None:
        """The answer kept for exactly ``read`` and its closers, now the caller's to close; None if none is."""
        return self._reads.pop(read, None)

    def drop(self) -> None:
        """Close every kept read."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        reads, self._reads = self._reads, {}
        for _, closers in reads.values():
            _close(closers)


def _close(closers: list[Callable[[], None]]) -> None:
    for close in closers:
        close()
