"""Sweeping the temporaries that interrupted atomic writes of partition records left, when a store opens.

A crash inside ``write_atomically`` leaves ``<name>.tmp`` beside the record it was replacing (the record itself
is whole: old or new). The store's checkpoints and topic metadata are swept under the store lock
(``Store.open``) and a log's folder by the segment loader; this sweeps the two record folders a partition may
hold, each under the lock its writers hold: ``compacted/`` (the compaction cursor and status, under the
compaction lock) and ``subscriptions/`` (the subscription cursors, under the subscriptions lock).
"""

from __future__ import annotations

from pathlib import Path

from storage.compacted import CompactedLedgers
from storage.cursors import remove_stray_cursor_temporaries
from storage.files import parse_partition_folder


def remove_stray_record_temporaries(root: Path) -> list[Path]:
    """Remove the record temporaries of every partition folder in the data folder ``root``; returns them."""
    removed: list[Path] = []
    for entry in root.iterdir():
        if entry.is_dir() and parse_partition_folder(entry.name) is not None:
            removed += CompactedLedgers(entry).remove_stray_record_temporaries()
            removed += remove_stray_cursor_temporaries(entry)
    return removed
