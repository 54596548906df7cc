"""Invariant 9: the memory of two-phase compaction is bounded by compaction.memory.bytes whatever the number of
keys, and a bounded run gives exactly the same ledger as an unbounded one.

The child process uses the system allocator for Arrow: pyarrow's default, mimalloc, keeps about 30 MB of freed
pages cached for reuse whatever the budget, which would hide what the compactor itself holds. And it runs glibc with
one arena: glibc keeps what each thread frees for the arena that thread uses, so with phase one's worker threads
the resident memory also grows with the number of arenas (measured at this budget: 15.5 MB of growth with glibc's
default arenas, 10.8 MB with three, 4.9 MB with one), which is the allocator's and not what the compactor holds
(docs/compaction.md says so to users).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from storage import Store
from storage.compacted import CompactedLedgers
from storage.schema import STORED_SCHEMA

SCRIPT = Path(__file__).parent / "processes" / "compact_memory.py"
BUDGET_BYTES = 4 * 1024 * 1024
MESSAGES, KEYS = 600_000, 450_000


def compact_in_subprocess(folder: Path, budget_bytes: int, *keys: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder), str(budget_bytes), str(MESSAGES), str(KEYS),
                           *keys],
                          capture_output=True, text=True, check=True, timeout=300,
                          env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "1"})
    growth, passes, _ = (int(field) for field in done.stdout.split())
    return growth, passes


def ledger_table(folder: Path) -> pa.Table:
    with Store.open(folder) as store:
        opened = CompactedLedgers(store.partition_log("t", 0).folder).open_current()
        assert opened is not None
        _, ledger = opened
        try:
            return pa.Table.from_batches(list(ledger.read_batches()), schema=STORED_SCHEMA)
        finally:
            ledger.close()


@pytest.mark.slow
def test_peak_memory_stays_near_the_budget_and_the_ledger_is_the_same(tmp_path: Path) -> None:
    unbounded_growth, unbounded_passes = compact_in_subprocess(tmp_path / "unbounded", 10**12)
    bounded_growth, bounded_passes = compact_in_subprocess(tmp_path / "bounded", BUDGET_BYTES)
    assert unbounded_passes == 1 and bounded_passes > 4
    assert bounded_growth < 3 * BUDGET_BYTES < unbounded_growth / 2
    assert ledger_table(tmp_path / "bounded").equals(ledger_table(tmp_path / "unbounded"))


@pytest.mark.slow
def test_keys_a_producer_chose_to_share_a_bucket_do_not_take_phase_one_past_its_budget(tmp_path: Path) -> None:
    """Phase one's buckets are the top bits of a key's word times a multiplier: a fixed one let a producer choose
    keys that all fall in one bucket, which phase one then finished whole (67 MB of growth at this 4 MiB budget).
    Now 0.5-4.9 MB (12 runs of the child, 6 of them beside three busy processes on the two cores), and once
    13.2 MB in a full run of the suite on three workers, not reproduced: the bound is 4 budgets, a quarter of that
    attack's growth."""
    growth, passes = compact_in_subprocess(tmp_path / "chosen", BUDGET_BYTES, "chosen")
    assert passes > 4 and growth < 4 * BUDGET_BYTES
