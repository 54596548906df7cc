"""What reading a store needs, whether it is a data folder (Store) or a remote tier read alone (RemoteStore):
the readers (readers/) are written against this, so they read either without knowing which."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import pyarrow as pa

from storage.compacted import CompactionCursor
from storage.ledger import LedgerReads
from storage.segment import SegmentReads
from storage.topics import TopicMetadata


class CompactedView(Protocol):
    """A partition's compacted ledgers as readers see them (CompactedLedgers, RemoteCompactedLedgers)."""

    def read_cursor(self) -> CompactionCursor | None: ...

    def open_current(self, *, verify: bool = True) -> tuple[CompactionCursor, LedgerReads] | None: ...

    def open_ledger(self, ledger_id: int, *, verify: bool = True) -> LedgerReads | None: ...


class ReadableStore(Protocol):
    verify_reads: bool
    clock: Callable[[], int]

    def list_topics(self) -> list[str]: ...

    def topic_metadata(self, topic: str) -> TopicMetadata: ...

    def start_offset(self, topic: str, partition: int) -> int: ...

    def end_offset(self, topic: str, partition: int) -> int: ...

    def read_batches(self, topic: str, partition: int, start_offset: int | None = None,
                     end_offset: int | None = None, *, join_bytes: int = 0) -> Iterator[pa.RecordBatch]: ...

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None: ...

    def size_bytes(self, topic: str, partition: int) -> int: ...

    def segments(self, topic: str, partition: int) -> Sequence[SegmentReads]:
        """The partition's segments in offset order, for cutting a read into tasks by size."""
        ...

    def compacted_ledgers(self, topic: str, partition: int) -> CompactedView: ...

    def close(self) -> None: ...
