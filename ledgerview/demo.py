"""The main job on the embedded default: a local data folder and built-in sample data, ending by itself.

It creates a topic, appends a sample price changelog, reads it back and checks it, prints segment stats, then
compacts the topic into its separate compacted ledgers and prints the compaction status and sizes.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa

from compactor import Compactor
from ledgerview.changelog import price_ticks
from storage import AppendResult, Store

TOPIC = "prices"


def run_demo(data: Path, *, symbols: int = 300, ticks: int = 200_000, partitions: int = 3) -> int:
    """Run the demo in ``data`` (emptied first); returns a process exit status."""
    if data.exists():
        shutil.rmtree(data)
    changelog = price_ticks(symbols, ticks)
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=partitions, config={"segment.bytes": str(256 * 1024)})
        started = time.perf_counter()
        offsets = store.append(TOPIC, changelog)
        append_seconds = time.perf_counter() - started
        started = time.perf_counter()
        tables = [store.read(TOPIC, partition) for partition in range(partitions)]
        read_seconds = time.perf_counter() - started
        read_back = pa.concat_tables(tables)
        ok = read_back.num_rows == changelog.num_rows and _same_messages(changelog, read_back, offsets)
        print(f"ledgerview demo: data folder {data.resolve()}")
        print(f"appended {len(offsets):,} price ticks for {symbols} symbols in {append_seconds:.2f} s; "
              f"read back {read_back.num_rows:,} in {read_seconds:.2f} s; contents match: {'yes' if ok else 'NO'}")
        print(f"tombstones (delisted symbols): {changelog['value'].null_count:,}")
        description = store.describe_topic(TOPIC)
        print(f"\n{'partition':>9} {'start':>8} {'end':>8} {'segments':>8} {'bytes':>12}")
        for info in description.partitions:
            print(f"{info.partition:>9} {info.start_offset:>8} {info.end_offset:>8} {info.segments:>8} "
                  f"{info.size_bytes:>12,}")
        started = time.perf_counter()
        results = Compactor(store).compact(TOPIC)
        compact_seconds = time.perf_counter() - started
        print(f"\ntwo-phase compaction in {compact_seconds:.2f} s (raw segments untouched):")
        print(f"{'partition':>9} {'horizon':>8} {'read':>8} {'kept':>6} {'removed':>8} {'ledger bytes':>13}")
        for result in results:
            print(f"{result.partition:>9} {result.horizon:>8} {result.messages_read:>8} {result.messages_kept:>6} "
                  f"{result.messages_removed:>8} {result.ledger_bytes:>13,}")
        live = sum(result.messages_kept for result in results)
        print(f"live symbols in the compacted view: {live} of {symbols}")
        first = store.read(TOPIC, 0, max_messages=3)
        print("\nfirst messages of partition 0:")
        for row in first.select(["offset", "timestamp", "key", "value"]).to_pylist():
            print(f"  offset {row['offset']}: {row['key'].decode()} = "
                  f"{row['value'].decode() if row['value'] is not None else '(tombstone)'}")
    return 0 if ok else 1


def _same_messages(written: pa.Table, read: pa.Table, offsets: AppendResult) -> bool:
    """Every written message is read back at the partition and offset that append returned."""
    columns = ["partition", "offset", "key", "value", "timestamp"]
    expected = written.append_column("partition", pa.array(offsets.partitions)).append_column(
        "offset", pa.array(offsets.offsets)).select(columns)
    order = [("partition", "ascending"), ("offset", "ascending")]
    return bool(expected.sort_by(order).equals(read.select(columns).cast(expected.schema).sort_by(order)))
