"""One partition's compacted view as a table: exactly one row per live key, its latest message as of the read
(Hudi's merge-on-read snapshot query; DESIGN.md, "Two shapes of the compacted view").

Reading a snapshot up to ``end_offset``, in this order:

1. Open the ledger the compaction cursor names (none before the first compaction) and keep it for the read.
   The read covers raw offsets below ``max(end_offset, horizon + 1)``: a compaction published after the read was
   planned may already cover newer messages, and its ledger no longer holds the older values, so the snapshot
   is then taken at its horizon instead (never older than planned, never a mix).
2. Fold the raw tail, offsets from ``max(horizon + 1, log start)`` up to that end, into each key's last message:
   a group-by per group of ``FOLD_ROWS`` messages merged with what earlier groups left, so memory grows with the
   tail's distinct keys, not its length. Keyless messages are not rows of a table and are left out. If
   retention or delete-records moves the log start meanwhile, the tail is folded again from the new start.
3. Serve the ledger's rows whose key the tail does not hold (one vectorised membership test per ledger batch; with
   keys pushed down, key-index lookups instead of a scan, or a filtered read of a ledger without a key index),
   then the tail's last messages that are not tombstones.

Cost: the tail plus the ledger scan (or lookups). Rows come in offset order within each part. A key that
producers put into several partitions has a row in each (a snapshot is per partition, as Kafka's partitioner
keeps a key in one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.batch_groups import grouped
from storage.errors import LedgerviewError, OffsetOutOfRangeError, SegmentDeletedError
from storage.ledger import LedgerReads
from storage.readable import ReadableStore
from storage.schema import with_partition_column

FOLD_ROWS = 1 << 20
"""Raw messages folded per group-by: bounds the memory of one fold whatever the length of the tail."""


def last_rows(table: pa.Table) -> pa.Table:
    """Each key's last row of ``table`` (keyed rows in offset order), kept in offset order."""
    numbered = table.append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    rows = numbered.group_by("key", use_threads=False).aggregate([("__row", "max")])["__row_max"]
    return table.take(np.sort(rows.to_numpy()))


def fold_tail(batches: Iterable[pa.RecordBatch], keys: frozenset[bytes] | None = None) -> pa.Table | None:
    """The last message of each key in ``batches`` (offset order), tombstones included; None when they hold
    no keyed message. ``keys``: only these keys."""
    wanted = None if keys is None else pa.array(sorted(keys), pa.binary())
    latest: pa.Table | None = None
    for group in grouped(batches, FOLD_ROWS):
        table = pa.Table.from_batches(group)
        mask = pc.is_valid(table["key"]) if wanted is None else pc.is_in(table["key"], value_set=wanted)
        table = table.filter(mask)
        if table.num_rows:
            latest = last_rows(table if latest is None else pa.concat_tables([latest, table]))
    return latest


def live_rows(tail: pa.Table | None) -> Iterator[pa.RecordBatch]:
    """The rows a folded tail (``fold_tail``) gives a snapshot: its keys' last messages but the tombstones."""
    if tail is not None:
        yield from tail.filter(pc.is_valid(tail["value"])).to_batches()


def snapshot_batches(store: ReadableStore, topic: str, partition: int, end_offset: int, *,
                     keys: frozenset[bytes] | None = None, ledger_offsets: tuple[int, int | None] = (0, None),
                     pinned: tuple[int, int] | None = None, with_tail: bool = True) -> Iterator[pa.RecordBatch]:
    """MESSAGE_SCHEMA batches of the partition's live keys (see the module docstring for the steps).

    ``keys``: only these keys. ``ledger_offsets``: [low, high) of the ledger rows worth serving, for a caller
    that filters offsets afterwards or splits the ledger over tasks (the tail is folded whole whatever it is: a
    tail message hides the ledger's row of its key even outside the range). ``pinned``: (ledger id, horizon) of
    the ledger to read, current or retiring, instead of the one the cursor names now, so that the tasks of one
    query all read the ledger it was planned on. ``with_tail``: serve the tail's rows too (one task of a split
    partition does)."""
    ledgers = store.compacted_ledgers(topic, partition)
    if pinned is None:
        opened = ledgers.open_current(verify=store.verify_reads)
        horizon = opened[0].horizon if opened is not None else -1
        ledger = opened[1] if opened is not None else None
    else:
        horizon, ledger = pinned[1], ledgers.open_ledger(pinned[0], verify=store.verify_reads)
        if ledger is None:
            raise LedgerRemovedError(topic, partition, pinned[0])
    try:
        tail = _folded_raw_tail(store, topic, partition, horizon + 1, max(end_offset, horizon + 1), keys)
        if ledger is not None:
            yield from _ledger_rows(ledger, partition, tail, keys, ledger_offsets, horizon)
        if with_tail:
            yield from live_rows(tail)
    finally:
        if ledger is not None:
            ledger.close()


def _folded_raw_tail(store: ReadableStore, topic: str, partition: int, low: int, end: int,
                     keys: frozenset[bytes] | None) -> pa.Table | None:
    """``fold_tail`` of the raw messages from ``max(low, log start)`` up to ``end``, folded again from the new log
    start when retention or delete-records moved it between reading it and reading the messages (those below it
    are gone: a read starting now would not see them either). The same error while the log start stays put is a
    real one, and raised."""
    while True:
        start = max(low, store.start_offset(topic, partition))
        if start >= end:
            return None
        try:
            return fold_tail(store.read_batches(topic, partition, start, end), keys)
        except (OffsetOutOfRangeError, SegmentDeletedError):
            if store.start_offset(topic, partition) <= start:
                raise


class LedgerRemovedError(LedgerviewError):
    def __init__(self, topic: str, partition: int, ledger_id: int) -> None:
        super().__init__(f"Compacted ledger {ledger_id} of {topic}-{partition}, which this read was planned on, was "
                         "removed before the read reached it (a newer compaction replaced it more than "
                         "file.delete.delay.ms ago). Run the read again: it plans on the current ledger.")


def ledger_rows_of_keys(ledger: LedgerReads, keys: Iterable[bytes], low: int, stop: int) -> Iterator[pa.RecordBatch]:
    """The ledger's messages of ``keys`` with ``low <= offset < stop``, in offset order: looked up one key at a time
    through its key index; or, for a view with a ledger written without one (compaction.key.index false), read
    from that offset range and filtered, since a lookup there would first read every key of the ledger."""
    if not ledger.key_indexed:
        wanted = pa.array(list(keys), pa.binary())
        for batch in ledger.read_batches(low, stop) if len(wanted) else ():
            selected = batch.filter(pc.is_in(batch.column("key"), value_set=wanted))
            if selected.num_rows:
                yield selected
        return
    found = [hit for key in keys if (hit := ledger.lookup(key)) is not None]
    found.sort(key=lambda batch: batch.column("offset")[0].as_py())
    for batch in found:
        if low <= batch.column("offset")[0].as_py() < stop:
            yield batch


def _ledger_rows(ledger: LedgerReads, partition: int, tail: pa.Table | None, keys: frozenset[bytes] | None,
                 offsets: tuple[int, int | None], horizon: int) -> Iterator[pa.RecordBatch]:
    shadowed = tail["key"].combine_chunks() if tail is not None else pa.array([], pa.binary())
    low, high = offsets
    stop = horizon + 1 if high is None else min(high, horizon + 1)
    if keys is not None:
        hidden = set(shadowed.to_pylist())
        for batch in ledger_rows_of_keys(ledger, [key for key in keys if key not in hidden], low, stop):
            yield with_partition_column(batch, partition)
        return
    if low >= stop:
        return
    for batch in ledger.read_batches(low, stop):
        key = batch.column("key")
        visible = pc.is_valid(key) if len(shadowed) == 0 else pc.and_(
            pc.is_valid(key), pc.invert(pc.is_in(key, value_set=shadowed)))
        selected = batch.filter(visible)
        if selected.num_rows:
            yield with_partition_column(selected, partition)
