"""The main job on the embedded default: a local data folder and built-in sample data, ending by itself.

It creates a topic, appends a sample price changelog, reads it back and checks it, and prints segment stats.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ledgerview.changelog import price_ticks
from storage import Store

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
        first = store.read(TOPIC, 0, max_messages=3)
        print("\nfirst messages of partition 0:")
        for row in first.select(["offset", "timestamp", "key", "value"]).to_pylist():
            print(f"  offset {row['offset']}: {row['key'].decode()} = "
                  f"{row['value'].decode() if row['value'] is not None else '(tombstone)'}")
    return 0 if ok else 1


def _same_messages(written: pa.Table, read: pa.Table, offsets: object) -> bool:
    """Every written message is read back at the partition and offset append returned."""
    from storage.store import AppendResult

    assert isinstance(offsets, AppendResult)
    expected = written.append_column("partition", pa.array(offsets.partitions)).append_column(
        "offset", pa.array(offsets.offsets))
    columns = ["partition", "offset", "key", "value", "timestamp"]
    left = expected.select(columns).sort_by([("partition", "ascending"), ("offset", "ascending")])
    right = read.select(columns).cast(left.schema).sort_by([("partition", "ascending"), ("offset", "ascending")])
    return bool(left.equals(right)) and pc.all(pc.equal(left["offset"], right["offset"])).as_py() is not False
