"""The latest value per key of one partition: its compacted ledger plus the raw tail above the horizon.

State:

- the ledger the compaction cursor names, kept open. Point lookups go through its rocksdict key index
  (``Ledger.lookup``: one RocksDB seek, a search of one group of keys and one batch decode), never a scan. A
  ledger written without one (compaction.key.index false) has its keys read once, by the first lookup (the
  tail's folding makes one when the tail holds keys), and searched in memory (storage/scanned_keys.py).
  Ledgers hold no tombstones.
- the tail: for each key written to the raw log above the horizon, its last message (offset, timestamp, value;
  a null value is a tombstone), and whether the ledger holds the key too. It is folded columnar: a group-by on the
  new raw batches finds each key's last row, and only those rows become dict entries.

A key's value: the tail's if the tail has the key (a tombstone hides the ledger's value), else the ledger's.

Refreshing (cheap when nothing changed: one read of the cursor record and the raw end offset):

1. The cursor names another ledger or horizon: open the new ledger, drop the tail entries at or below the new
   horizon (the ledger covers them; an entry above it is still the key's last message), re-check the others
   against the new ledger, and read the raw log from above the new horizon if that is past what was read. A
   horizon that went back (the compacted view was rebuilt) or a cursor that disappeared starts from scratch.
2. Fold the raw messages appended since the last refresh into the tail.

Without a compaction the tail starts at the raw log start. Messages retention deletes after they were folded in
stay in the state (as in a Kafka KTable), though a fresh view would not see them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from readers.snapshot import FOLD_ROWS, last_rows
from storage.batch_groups import grouped
from storage.compacted import CompactionCursor
from storage.ledger import LedgerReads
from storage.readable import ReadableStore


class TailEntry(NamedTuple):
    offset: int
    timestamp: int
    value: bytes | None
    """None: a tombstone."""
    in_ledger: bool
    """Whether the current ledger also holds the key (its value there is hidden by this entry)."""


class PartitionTable:
    def __init__(self, store: ReadableStore, topic: str, partition: int) -> None:
        self.store, self.topic, self.partition = store, topic, partition
        self._ledgers = store.compacted_ledgers(topic, partition)
        self._cursor: CompactionCursor | None = None
        self._ledger: LedgerReads | None = None
        self._ledger_keys: int | None = None
        """Keys in the ledger, counted on first need (the ledger never changes)."""
        self._tail: dict[bytes, TailEntry] = {}
        self._tail_end = 0
        """Raw messages below this offset are in the state (folded into the tail, or covered by the ledger)."""

    # ------------------------------------------------------------------------------------------------- refresh
    def refresh(self) -> None:
        cursor = self._ledgers.read_cursor()
        if _identity(cursor) != _identity(self._cursor):
            self._switch_ledger()
        end = self.store.end_offset(self.topic, self.partition)
        if end > self._tail_end:
            start = max(self._tail_end, self.store.start_offset(self.topic, self.partition))
            self._fold(self.store.read_batches(self.topic, self.partition, start, end))
            self._tail_end = end

    def _switch_ledger(self) -> None:
        opened = self._ledgers.open_current()
        previous, previous_ledger = self._cursor, self._ledger
        if opened is None or (previous is not None and opened[0].horizon < previous.horizon):
            self._tail, self._tail_end = {}, 0
        self._cursor, self._ledger = opened if opened is not None else (None, None)
        self._ledger_keys = None
        if previous_ledger is not None:
            previous_ledger.close()
        if self._cursor is None:
            return
        horizon = self._cursor.horizon
        self._tail = {
            key: entry._replace(in_ledger=self._ledger_has(key))
            for key, entry in self._tail.items()
            if entry.offset > horizon
        }
        self._tail_end = max(self._tail_end, horizon + 1)

    def _fold(self, batches: Iterable[pa.RecordBatch]) -> None:
        for group in grouped(batches, FOLD_ROWS):
            self._fold_table(pa.Table.from_batches(group))

    def _fold_table(self, table: pa.Table) -> None:
        """Each key's last message in ``table`` (offset order) into the tail: group-by, then a dict per key."""
        keyed = table.select(["offset", "timestamp", "key", "value"]).filter(pc.is_valid(table["key"]))
        if keyed.num_rows == 0:
            return
        latest = last_rows(keyed).to_pydict()
        tail = self._tail
        for key, offset, timestamp, value in zip(latest["key"], latest["offset"], latest["timestamp"],
                                                 latest["value"], strict=True):
            known = tail.get(key)
            in_ledger = known.in_ledger if known is not None else self._ledger_has(key)
            tail[key] = TailEntry(offset, timestamp, value, in_ledger)

    def _ledger_has(self, key: bytes) -> bool:
        return self._ledger is not None and self._ledger.offset_of(key) is not None

    # --------------------------------------------------------------------------------------------------- reads
    def get(self, key: bytes) -> tuple[int, bytes] | None:
        """(timestamp, value) of the key's live message; None if absent or tombstoned. No scan: a dict lookup,
        then one key-index lookup in the ledger (a search in memory of its keys, read once, for a ledger without a
        key index)."""
        entry = self._tail.get(key)
        if entry is not None:
            return None if entry.value is None else (entry.timestamp, entry.value)
        if self._ledger is None:
            return None
        row = self._ledger.lookup(key)
        if row is None:
            return None
        value = row.column("value")[0].as_py()
        return None if value is None else (int(row.column("timestamp")[0].as_py()), value)

    def live_keys(self) -> list[bytes]:
        keys: list[bytes] = []
        for batch in self._visible_ledger_batches(["key"]):
            keys.extend(batch.column("key").to_pylist())
        keys.extend(key for key, entry in self._tail.items() if entry.value is not None)
        return keys

    def live_items(self) -> list[tuple[bytes, int, bytes]]:
        """(key, timestamp, value) of every live key."""
        items: list[tuple[bytes, int, bytes]] = []
        for batch in self._visible_ledger_batches(["key", "timestamp", "value"]):
            columns = batch.to_pydict()
            items.extend(zip(columns["key"], columns["timestamp"], columns["value"], strict=True))
        items.extend((key, entry.timestamp, entry.value) for key, entry in self._tail.items()
                     if entry.value is not None)
        return items

    def count(self) -> int:
        """Live keys: the ledger's, less those the tail holds, plus the tail's live ones."""
        if self._ledger is not None and self._ledger_keys is None:
            self._ledger_keys = sum(batch.num_rows - batch.column("key").null_count
                                    for batch in self._ledger.read_batches())
        shadowed = sum(1 for entry in self._tail.values() if entry.in_ledger)
        live = sum(1 for entry in self._tail.values() if entry.value is not None)
        return (self._ledger_keys or 0) - shadowed + live

    def _visible_ledger_batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """Ledger rows whose key the tail does not hold, one vectorised membership test per batch."""
        if self._ledger is None:
            return
        tail_keys = pa.array(list(self._tail), pa.binary())
        for batch in self._ledger.read_batches():
            key = batch.column("key")
            visible = pc.and_(pc.is_valid(key), pc.invert(pc.is_in(key, value_set=tail_keys)))
            yield batch.filter(visible).select(columns)

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


def _identity(cursor: CompactionCursor | None) -> tuple[int, int] | None:
    return None if cursor is None else (cursor.ledger_id, cursor.horizon)
