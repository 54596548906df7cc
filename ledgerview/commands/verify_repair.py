"""``ledgerview verify --repair``: rebuild each damaged compacted view from the raw log, where it still is.

A compacted view (ledger, key index, cursor) holds nothing the raw log did not: while retention has kept every raw
message from the ledger's first offset on, compacting the raw log from its start (``compact_partition(...,
rebuild=True)``) writes a fresh ledger and key index and publishes them as any compaction does; readers of the
damaged ledger finish on it. Where retention removed raw messages the view still needs, or a segment went from the
middle of the raw log (verify names the offsets in no segment), nothing is changed and the finding says so.
"""

from __future__ import annotations

from compactor import CompactionInProgressError
from compactor.run import compact_partition
from storage import Store
from storage.errors import LedgerviewError


def repair_views(store: Store, damaged: dict[tuple[str, int], int],
                 raw_gaps: dict[tuple[str, int], tuple[int, int]]) -> tuple[list[str], list[str]]:
    """Rebuild the compacted views ``damaged`` names (from ``Report.damaged_views``), but not those whose raw log
    lacks offsets (``Report.raw_gaps``): a rebuild reads over the gap and would lose what only the view holds of
    them. Returns (what was repaired, what could not be), one line per partition."""
    repaired, not_repaired = [], []
    for (topic, partition), needed_from in sorted(damaged.items()):
        name = f"{topic}-{partition}"
        try:
            log = store.partition_log(topic, partition)
        except LedgerviewError as error:
            not_repaired.append(f"{name}: its compacted view is damaged and its raw log cannot be opened to rebuild "
                                f"it: {error}")
            continue
        if log.log_start_offset > needed_from:
            not_repaired.append(
                f"{name}: its compacted view is damaged and cannot be rebuilt: retention removed the raw messages "
                f"below offset {log.log_start_offset}, and the view may hold messages from offset {needed_from} on. "
                f"Restore {log.folder / 'compacted'} from a copy, or remove that folder to give the view up and "
                "serve the raw log alone as the compacted view (the keys only the ledger held are then lost).")
            continue
        if (topic, partition) in raw_gaps:
            first, last = raw_gaps[(topic, partition)]
            not_repaired.append(
                f"{name}: its compacted view is damaged, and its raw log lacks offsets {first} to {last} (a segment "
                "lost): a rebuild would drop what only the view holds of them. Restore the lost segment and run "
                f"verify --repair again, or restore {log.folder / 'compacted'} from a copy.")
            continue
        try:
            result = compact_partition(log, clock=store.clock, rebuild=True)
        except CompactionInProgressError:
            not_repaired.append(f"{name}: a compaction is running; run verify --repair again once it is over.")
            continue
        except LedgerviewError as error:
            not_repaired.append(f"{name}: the rebuild from the raw log failed: {error}")
            continue
        repaired.append(f"{name}: compacted view rebuilt from raw offsets {log.log_start_offset} to {result.horizon}"
                        f" as ledger {result.ledger_id} ({result.messages_kept} messages kept of "
                        f"{result.messages_read} read)")
    return repaired, not_repaired
