"""A Fetch response as a list of pieces whose sizes are known before any record batch is encoded, so it is
written piece by piece (ledgerview/kafka/response_sender.py) instead of built whole: the frame's size and each
partition's records length come first on the wire, then each batch is encoded only when its turn to be written
comes. Versions 4-11 (the non-flexible ones), field by field as Kafka's FetchResponse.json: throttle_time_ms,
error_code and session_id (v7+), then per topic its name and per partition partition_index, error_code,
high_watermark, last_stable_offset, log_start_offset (v5+), aborted_transactions (null), preferred_read_replica
(v11+) and records."""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from ledgerview.kafka.protocol import ErrorCode

Buffer = bytes | bytearray | memoryview


def _nothing_to_give_back(data: Buffer) -> None:
    """A piece whose bytes need nothing once written: they are simply dropped."""


@dataclass(frozen=True)
class Piece:
    """``size`` bytes of a response, produced by ``make`` when they are written and handed to ``written`` once the
    transport has taken them (a reused buffer goes back then: ledgerview/kafka/batch_cache.py). Meanwhile the
    queued.max.request.bytes pool counts ``charge`` bytes for them: ``size``, or the larger buffer ``make`` may
    encode them into."""

    size: int
    make: Callable[[], Buffer]
    charge: int
    written: Callable[[Buffer], None] = _nothing_to_give_back


def close_all(closers: list[Callable[[], None]]) -> None:
    """Close what a read holds (its ledgers), in order."""
    for close in closers:
        close()


def fixed(data: bytes) -> Piece:
    """A piece already in memory."""
    return Piece(len(data), lambda: data, len(data))


@dataclass
class PartitionAnswer:
    index: int
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    batches: list[Piece] = field(default_factory=list)
    resume_offset: int | None = None
    """When the read stopped at its byte budget with more to read, the offset after the last message served: where
    a consumer's next Fetch will likely start (None when it reached the end, an error or a damaged batch)."""

    @property
    def records_bytes(self) -> int:
        return sum(piece.size for piece in self.batches)


@dataclass
class FramedResponse:
    """A response's pieces, frame size first; ``close`` releases what they read from (call it once written)."""

    pieces: list[Piece]
    close: Callable[[], None]
    read_ahead: Callable[[], Generator[Piece, None, None]] | None = None
    """The pieces of the response the client will likely ask for next, worth making before it asks (a Fetch's
    read-ahead: response_sender.py); None when there is none."""


@dataclass
class StreamedFetchResponse:
    version: int
    topics: list[tuple[str, list[PartitionAnswer]]]
    closers: list[Callable[[], None]] = field(default_factory=list)
    """What the batches are read from (ledgers), closed once the response is written."""
    read_ahead: Callable[[], Generator[Piece, None, None]] | None = None
    """As FramedResponse.read_ahead."""

    @property
    def records_bytes(self) -> int:
        return sum(answer.records_bytes for _, answers in self.topics for answer in answers)

    @property
    def has_errors(self) -> bool:
        return any(answer.error is not ErrorCode.NONE for _, answers in self.topics for answer in answers)

    def close(self) -> None:
        close_all(self.closers)
        self.closers.clear()

    def framed(self, correlation_id: int) -> FramedResponse:
        """The response on the wire: size, header v0 (the correlation id), body."""
        head = struct.pack(">ii", correlation_id, 0)  # throttle_time_ms 0
        if self.version >= 7:
            head += struct.pack(">hi", 0, 0)  # error_code, session_id
        pieces = [fixed(head + struct.pack(">i", len(self.topics)))]
        for name, answers in self.topics:
            encoded_name = name.encode()
            pieces.append(fixed(struct.pack(">h", len(encoded_name)) + encoded_name + struct.pack(">i", len(answers))))
            for answer in answers:
                pieces.append(fixed(self._partition_head(answer)))
                pieces.extend(answer.batches)
        size = sum(piece.size for piece in pieces)
        return FramedResponse([fixed(struct.pack(">i", size)), *pieces], self.close, self.read_ahead)

    def _partition_head(self, answer: PartitionAnswer) -> bytes:
        head = struct.pack(">ihqq", answer.index, answer.error.value, answer.high_watermark, answer.high_watermark)
        if self.version >= 5:
            head += struct.pack(">q", answer.log_start_offset)
        head += struct.pack(">i", -1)  # aborted_transactions: null
        if self.version >= 11:
            head += struct.pack(">i", -1)  # preferred_read_replica
        return head + struct.pack(">i", answer.records_bytes)
