"""Errors of the reader API; each message says what was given, what is allowed and what to do."""

from __future__ import annotations

from storage.errors import LedgerviewError


class InvalidPositionError(LedgerviewError):
    """A start or seek position that is not one of the position kinds."""

    def __init__(self, position: object, reason: str) -> None:
        self.position = position
        super().__init__(
            f"Invalid position {position!r}: {reason}. A position is 'earliest', 'latest', an int offset >= 0, "
            "readers.Timestamp(ms), or a dict from partition to one of those."
        )


class AcknowledgementOutOfRangeError(LedgerviewError):
    """An acknowledgement of an offset the partition has never held."""

    def __init__(self, topic: str, partition: int, offset: int, end_offset: int) -> None:
        self.offset, self.end_offset = offset, end_offset
        super().__init__(
            f"Cannot acknowledge offset {offset} of {topic}-{partition}: its offsets are below {end_offset}. "
            "Acknowledge the offset of a message this consumer received."
        )


class ReaderClosedError(LedgerviewError):
    def __init__(self, what: str) -> None:
        super().__init__(f"This {what} is closed; open a new one.")
