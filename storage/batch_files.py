"""Files of batches (segment ``.log`` files and compacted ledgers) opened for inspection, through storage's codec.

Unlike the store's readers, which stop at the first bad batch, an inspection walks every batch whose header
parses and reports each one's CRC as valid or not; it ends where a header no longer parses (a torn tail or
damage) and says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from storage.codec import (
    BatchFormatError,
    BatchHeader,
    decode_payload,
    dictionary_columns,
    read_header,
    verify_batch,
)


@dataclass(frozen=True)
class ScannedBatch:
    header: BatchHeader
    crc_valid: bool
    crc_problem: str | None


@dataclass(frozen=True)
class UnreadableTail:
    """Where the batches of a file stop making sense before its end."""

    position: int
    remaining_bytes: int
    reason: str


class BatchFile:
    """One file of batches, memory-mapped read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size_bytes = path.stat().st_size
        if self.size_bytes:
            with pa.memory_map(str(path), "r") as mapped:
                self.buffer = mapped.read_buffer()
        else:
            self.buffer = pa.py_buffer(b"")
        self.tail: UnreadableTail | None = None
        """Set by ``scan`` when the file does not end at a batch boundary."""

    def scan(self) -> Iterator[ScannedBatch]:
        """Every batch whose header parses, in file order, with its CRC checked."""
        view = memoryview(self.buffer)
        position = 0
        while position < self.size_bytes:
            try:
                header = read_header(view, position, self.size_bytes - position)
            except BatchFormatError as error:
                self.tail = UnreadableTail(position, self.size_bytes - position, error.reason)
                return
            try:
                verify_batch(view, header)
                yield ScannedBatch(header, True, None)
            except BatchFormatError as error:
                yield ScannedBatch(header, False, error.reason)
            position = header.end_position

    def decode(self, header: BatchHeader) -> pa.RecordBatch:
        """The batch's messages (STORED_SCHEMA); raises BatchFormatError when the payload does not decode."""
        return decode_payload(self.buffer, header)

    def dictionary_columns(self, header: BatchHeader) -> tuple[str, ...]:
        """The columns the batch stores as dictionaries (none in the plain layout); raises BatchFormatError when
        its payload's first message does not parse."""
        return dictionary_columns(self.buffer, header)
