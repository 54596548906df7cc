"""One two-phase compaction run of one partition, Pulsar's algorithm over ledgerview's files.

1. Under the partition's compaction lock (a second run fails at once), remove orphan ledgers of crashed runs and
   retired ledgers past ``file.delete.delay.ms``; record the status RUNNING.
2. Take the end offset now: messages appended later are left for the next run.
3. Phase one reads the current view (not for a layered run), then the raw log above its horizon up to that end
   offset, and finds the latest live message per key (compactor/latest_offsets.py). Each of its runs hands its
   keys to a thread (compactor/run_work.py; the last one works while phase two runs): its survivors' keys and
   offsets go to the new ledger's key index as a sorted run, unless the topic has compaction.key.index false and
   no remote tier (then the ledger gets no key index, and lookups in it read its keys); a layered run marks the
   view's rows they replace.
4. Phase two writes the survivors, in offset order with their original offsets, timestamps and headers, to the
   new ledger; then the ledger is fsynced and the key index's runs ingested. It writes either
   - the whole view, reading phase one's input again (Pulsar's way), or
   - a layered view (storage/ledger_layers.py, see ``_layered``): only the survivors from the raw log, over the
     current view's ledgers, in each of which the rows whose keys the new messages hold are marked deleted. Phase
     one then reads only the raw log above the horizon, and the view's keys are read to test each against the new
     keys, once for each run of phase one (compactor/replaced_rows.py). What it writes follows the new messages,
     not the size of the view.
5. Publish: replace the compaction cursor atomically (storage/compacted.py). A crash before it leaves the old view
   and an orphan; after it, the new view and retired or orphaned old ledgers. The raw log is never written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from compactor.errors import CompactionInProgressError
from compactor.latest_offsets import Survivors, find_survivors
from compactor.replaced_rows import ReplacedRows
from compactor.run_work import RunStep, RunWork, index_run
from storage import faults
from storage.compacted import CompactedLedgers, CompactionCursor
from storage.compaction_status import CompactionState, CompactionStatus, read_status, write_status
from storage.dropped_tombstones import after_run
from storage.errors import PartitionLockedError
from storage.ledger import LedgerReads, LedgerWriter
from storage.ledger_layers import write_layer_record
from storage.partition_log import Clock, PartitionLog
from storage.schema import STORED_SCHEMA, null_headers
from storage.segment import JOINED_READ_BYTES

HEADERS_COLUMN = STORED_SCHEMA.get_field_index("headers")
HEADERS_FIELD = STORED_SCHEMA.field(HEADERS_COLUMN)
OUTPUT_BATCH_MESSAGES = 65_536
OUTPUT_BATCH_MIN_MESSAGES = 1_024
OUTPUT_BATCH_MIN_BYTES = 64 * 1024
BUDGET_BYTES_PER_PENDING_MESSAGE = 256
"""Phase two writes a batch when it holds an eighth of the memory budget (it is copied twice more on its way out,
and the key index's last run is written meanwhile) or OUTPUT_BATCH_MESSAGES messages; with a
small budget, fewer messages (each costs about this much while it waits to be written)."""


@dataclass(frozen=True)
class CompactionResult:
    """What one run of one partition did."""

    partition: int
    ledger_id: int | None
    """The ledger now serving the compacted view (None if the partition was never compacted and is empty)."""
    horizon: int
    """Last raw offset the compacted view covers (-1: none)."""
    messages_read: int
    messages_kept: int
    ledger_bytes: int
    passes: int
    """Runs phase one finished its keys in (one sorted run of the key index each, but for a run of tombstones
    only): 1 unless its survivors had to be split to stay within compaction.memory.bytes."""
    skipped: bool
    """True when nothing new was above the horizon, so the previous ledger stays."""
    layers: int = 1
    """Ledgers the view reads: more than one for a layered view (storage/ledger_layers.py), none before the first
    compaction."""

    @property
    def messages_removed(self) -> int:
        """Messages this run left out; a skipped run read nothing and removed nothing (its ``messages_kept`` is
        what the ledger it leaves in place holds)."""
        return 0 if self.skipped else self.messages_read - self.messages_kept


def compact_partition(log: PartitionLog, *, clock: Clock, rebuild: bool = False) -> CompactionResult:
    """``rebuild``: leave the current ledger out and compact the raw log from its start into a new ledger
    (``ledgerview verify --repair`` rebuilds a damaged compacted view so, while the raw log still holds it)."""
    ledgers = CompactedLedgers(log.folder)
    try:
        lock = ledgers.lock(wait=False)
        lock.acquire(wait=False)
    except PartitionLockedError:
        raise CompactionInProgressError(log.topic, log.partition) from None
    previous = read_status(log.folder, log.partition, run_in_progress=lambda: False)
    published = previous.published_ledger_id
    status = CompactionStatus(log.partition, CompactionState.RUNNING, started_ms=clock(), published_ledger_id=published)
    try:
        if not rebuild:  # before the status and the orphans change: a lost cursor must leave its ledgers
            ledgers.check_cursor_not_lost()
        write_status(log.folder, status)
        ledgers.remove_orphans_and_retired(delete_delay_ms=log.config.file_delete_delay_ms)
        result = _run(log, ledgers, clock, rebuild=rebuild)
        if result.skipped and previous.state is CompactionState.SUCCESS:
            write_status(log.folder, previous)  # nothing new: the last run that did the work stays the one shown
        else:
            write_status(log.folder, CompactionStatus(
                log.partition, CompactionState.SUCCESS, None, status.started_ms, clock(),
                result.messages_read, result.messages_kept, result.messages_removed,
                published if result.ledger_id is None else result.ledger_id))
        return result
    except Exception as error:
        write_status(log.folder, CompactionStatus(
            log.partition, CompactionState.ERROR, f"{type(error).__name__}: {error}", status.started_ms, clock(),
            published_ledger_id=published))
        raise
    finally:
        lock.__exit__(None, None, None)


def _run(log: PartitionLog, ledgers: CompactedLedgers, clock: Clock, *, rebuild: bool) -> CompactionResult:
    log.refresh()
    end_offset = log.end_offset
    current = None if rebuild else ledgers.open_current()
    previous_cursor, previous_view = current if current else (None, None)
    try:
        horizon = previous_cursor.horizon if previous_cursor else -1
        tiered = log.config.remote_storage_enable
        key_index = log.config.compaction_key_index or tiered
        # a layered or unindexed view of a topic that has since turned remote.storage.enable on is rewritten whole
        # even with nothing new: the remote tier copies only views of one ledger with its key index
        tiered_rewrite = tiered and previous_cursor is not None and not ledgers.tier_can_copy(previous_cursor)
        if (end_offset - 1 <= horizon and not tiered_rewrite) or end_offset == log.log_start_offset == 0:
            return _unchanged(log.partition, previous_cursor)
        raw_start = max(horizon + 1, log.log_start_offset)

        # the raw log's stored batches joined, as in other reads, but within a sixteenth of the budget
        join_bytes = min(JOINED_READ_BYTES, log.config.compaction_memory_bytes // 16)

        def raw_batches() -> Iterator[pa.RecordBatch]:
            return log.read_batches(raw_start, end_offset, join_bytes=join_bytes)

        def input_batches() -> Iterator[pa.RecordBatch]:
            if previous_view is not None:
                yield from previous_view.read_batches()
            yield from raw_batches()

        ledger_id = ledgers.next_ledger_id()
        replaced = None  # set for a layered run: the view's rows the new messages replace
        if previous_cursor and previous_view and _layered(log, ledgers, previous_cursor, previous_view):
            replaced = ReplacedRows(previous_cursor, previous_view,
                                    retain_null_key=log.config.compaction_retain_null_key,
                                    memory_budget_bytes=log.config.compaction_memory_bytes)
        compression = log.config.compression_type if log.config.compression_type in ("lz4", "zstd") else None
        writer = LedgerWriter(*ledgers.ledger_paths(ledger_id), compression=compression, key_index=key_index)
        try:
            steps: list[RunStep] = [index_run(writer.keys)] if key_index else []
            if replaced is not None:
                steps.append(replaced.mark)
            with RunWork(steps) as runs:
                phase_one_input = raw_batches if replaced else input_batches
                bound = (0 if replaced or not previous_view else previous_view.messages) + end_offset - raw_start
                survivors = find_survivors(phase_one_input, messages_bound=bound,
                                           memory_budget_bytes=log.config.compaction_memory_bytes,
                                           retain_null_key=log.config.compaction_retain_null_key,
                                           on_pass=runs.submit if steps else None,
                                           tombstone_keys=replaced is not None)
                try:
                    faults.crash_point("compactor.after_phase_one")
                    _write_ledger(writer, phase_one_input(), survivors, budget=log.config.compaction_memory_bytes)
                finally:
                    survivors.close()
            lower = replaced.lower_layers() if replaced else []
            write_layer_record(ledgers.layer_record_path(ledger_id), lower)
            writer.finish()
        except BaseException:
            writer.abort()
            ledgers.layer_record_path(ledger_id).unlink(missing_ok=True)
            raise
        kept = writer.messages + sum(int((~layer.deleted).sum()) for layer in lower)
        size = writer.size_bytes + (previous_view.size_bytes if lower and previous_view else 0)
        # a rebuild knows none of the earlier runs' ranges, but reads from the log start: what it never reads
        # covers every tombstone retention removed
        dropped = after_run(previous_cursor.dropped_tombstones if previous_cursor else (), horizon, raw_start,
                            survivors.dropped_tombstones)
        # a layered run reads the view's keys apart from phase one (what is read and not kept stays "removed")
        read = survivors.messages_read + (previous_view.messages if replaced and previous_view else 0)
        cursor = CompactionCursor(ledger_id, end_offset - 1, read, kept, size, clock(),
                                  lower_layers=tuple(layer.ledger_id for layer in lower),
                                  dropped_tombstones=dropped)
        faults.crash_point("compactor.before_publish")
        ledgers.publish(cursor)
        return CompactionResult(log.partition, cursor.ledger_id, cursor.horizon, cursor.messages_read,
                                cursor.messages_kept, cursor.ledger_bytes, survivors.runs, skipped=False,
                                layers=len(cursor.ledger_ids))
    finally:
        if previous_view is not None:
            previous_view.close()


def _layered(log: PartitionLog, ledgers: CompactedLedgers, cursor: CompactionCursor, view: LedgerReads) -> bool:
    """Whether this run writes a layered view over the current one rather than the whole view: not once the view
    would read more than compaction.max.layers ledgers (each costs a point lookup that misses the layers above it
    one more key-index seek, and holds raw data from retention: storage/compacted.py's
    ``retention_hold_offset``), nor once half the rows its ledgers hold are deleted (a reader would read twice
    what it serves), nor for a topic with remote.storage.enable (the remote tier copies a view of one ledger), nor
    over a view an earlier release published (it has no layer record to retire)."""
    if log.config.remote_storage_enable:
        return False
    if not ledgers.has_layer_record(cursor.ledger_id):
        return False
    stored = sum(header.record_count for header in view.headers)
    return len(cursor.ledger_ids) < log.config.compaction_max_layers and 2 * (stored - view.messages) < stored


def _unchanged(partition: int, cursor: CompactionCursor | None) -> CompactionResult:
    if cursor is None:
        return CompactionResult(partition, None, -1, 0, 0, 0, 0, skipped=True, layers=0)
    return CompactionResult(partition, cursor.ledger_id, cursor.horizon, 0, cursor.messages_kept,
                            cursor.ledger_bytes, 0, skipped=True, layers=len(cursor.ledger_ids))


def _write_ledger(writer: LedgerWriter, batches: Iterator[pa.RecordBatch], survivors: Survivors, *,
                  budget: int) -> None:
    """Phase two: keep exactly the surviving offsets, coalesced into batches (see OUTPUT_BATCH_MESSAGES)."""
    flush_bytes = max(OUTPUT_BATCH_MIN_BYTES, budget // 8)
    flush_rows = min(OUTPUT_BATCH_MESSAGES, max(OUTPUT_BATCH_MIN_MESSAGES, budget // BUDGET_BYTES_PER_PENDING_MESSAGE))
    pending: list[pa.RecordBatch] = []
    pending_rows = pending_bytes = 0
    for batch in batches:
        offsets = batch.column(0).to_numpy()
        first = int(offsets[0])
        kept = survivors.within(first, int(offsets[-1]))
        if len(kept) == 0:
            continue
        contiguous = int(offsets[-1]) - first + 1 == len(offsets)  # raw batches are, ledger batches are not
        rows = kept - first if contiguous else np.searchsorted(offsets, kept)
        kept_rows = batch if len(kept) == batch.num_rows else _take(batch, rows)
        pending.append(kept_rows)
        pending_rows += len(kept)
        pending_bytes += kept_rows.get_total_buffer_size()
        if pending_rows >= flush_rows or pending_bytes >= flush_bytes:
            writer.append(pa.concat_batches(pending))
            faults.crash_point("compactor.phase_two_write")
            pending, pending_rows, pending_bytes = [], 0, 0
    if pending:
        writer.append(pa.concat_batches(pending))


def _take(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    """The given rows of a batch. A headers column that is all null (the usual case) is made, not taken: taking a
    list<struct> column costs as much as taking the other four."""
    headers = batch.column(HEADERS_COLUMN)
    if headers.null_count != len(headers):
        return batch.take(rows)
    return batch.drop_columns([HEADERS_FIELD.name]).take(rows).append_column(HEADERS_FIELD, null_headers(len(rows)))
