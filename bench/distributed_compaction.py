"""Issue 17: two-phase compaction as Spark work (streaming/compaction.py) beside the single-process compactor, on
the same log: 10M messages, 1M uniform keys, 100-byte values, 1% tombstones (bench/datasets.py), one partition.

The single-process compactor compacts the log in a data folder. For Spark the same sealed segments are copied to a
``file://`` tier as a remote log no data folder owns (as a Spark sink with an object-store path writes them); a
local folder, not moto, holds the tier, so the figures measure the compaction and not a Python S3 server. Each
Spark run is a process of its own on ``local-cluster[N,1,4096]`` (N executors of one core): the session starts
untimed, then ``compact_with_spark`` is timed, first compaction, ledger and key index included.

Usage: python -m bench.distributed_compaction [--messages N] [--keys K] [--executors 1 2]
Prints a markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.datasets import describe, ensure_dataset, load
from compactor import Compactor
from ledgerview.changelog import ChangelogSpec
from storage import Store
from storage.object_store import open_object_store
from storage.remote_log import RemoteLog, change_unowned
from storage.remote_store import remote_topic_key, wall_clock_ms

TOPIC = "bench"
SEGMENT_BYTES = 64 * 1024 * 1024
APPEND_ROWS = 1_000_000


def prepare(folder: Path, spec: ChangelogSpec) -> None:
    table = load(ensure_dataset(spec))
    with Store.open(folder) as store:
        store.create_topic(TOPIC, 1, {"segment.bytes": str(SEGMENT_BYTES)})
        for start in range(0, table.num_rows, APPEND_ROWS):
            store.append(TOPIC, table.slice(start, APPEND_ROWS), partition=0)
        store.roll(TOPIC, 0)


def export_unowned(folder: Path, uri: str) -> None:
    """The folder's sealed segments as a remote log that no data folder owns."""
    objects = open_object_store(uri)
    with Store.open(folder, read_only=True) as store:
        objects.create(remote_topic_key(TOPIC), store.topic_metadata(TOPIC).encode())
        log = RemoteLog(objects, TOPIC, 0)
        infos = tuple(log.upload(segment) for segment in store.partition_log(TOPIC, 0).segments[:-1])
    change_unowned(log, lambda manifest: type(manifest)(manifest.version, 0, 0, infos, 0), wall_clock_ms)


def run_spark(uri: str, executors: int) -> dict[str, float]:
    """In a process of its own: start the cluster, then time the compaction."""
    from streaming import local_session
    from streaming.compaction import compact_with_spark

    started = time.perf_counter()
    spark = local_session("ledgerview-bench", master=f"local-cluster[{executors},1,4096]",
                          config={"spark.executor.memory": "3g"})
    spark.sparkContext.parallelize(range(executors * 4), executors * 4).count()  # executors up
    ready = time.perf_counter()
    result = compact_with_spark(spark, uri, TOPIC)[0]
    done = time.perf_counter()
    spark.stop()
    return {"session_s": ready - started, "seconds": done - ready, "kept": result.messages_kept,
            "ledger_pieces": result.ledger_pieces, "key_index_pieces": result.key_index_pieces}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--executors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--run-spark", nargs=2, metavar=("URI", "EXECUTORS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_spark:
        print(json.dumps(run_spark(args.run_spark[0], int(args.run_spark[1]))), flush=True)
        return 0
    spec = ChangelogSpec(args.messages, args.keys, value_bytes=100, tombstone_share=0.01)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ledgerview-bench-", dir=Path(__file__).parent / "data") as work:
        folder = Path(work) / "data"
        prepare(folder, spec)
        for executors in args.executors:
            uri = f"file://{work}/tier-{executors}"
            export_unowned(folder, uri)
            child = subprocess.run([sys.executable, "-m", "bench.distributed_compaction", "--run-spark", uri,
                                    str(executors)], capture_output=True, text=True, check=True)
            rows.append((executors, json.loads(child.stdout.strip().splitlines()[-1])))
        with Store.open(folder) as store:
            started = time.perf_counter()
            single = Compactor(store).compact(TOPIC)[0]
            single_s = time.perf_counter() - started
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## {now}: distributed-compaction\n\n{describe(spec)}; {platform.machine()}, "
          f"{platform.python_version()}\n")
    print("| compactor | seconds | kept | ledger pieces | key index pieces | session start (untimed) |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| single process | {single_s:.2f} | {single.messages_kept:,} | 1 | 1 | |")
    for executors, row in rows:
        print(f"| Spark, {executors} executor(s) | {row['seconds']:.2f} | {row['kept']:,} | {row['ledger_pieces']} "
              f"| {row['key_index_pieces']} | {row['session_s']:.1f} |")
    if len(rows) >= 2:
        (n1, first), (n2, second) = rows[0], rows[1]
        # T(n) = fixed + work / n, fitted through the two measured points
        work = (first["seconds"] - second["seconds"]) / (1 / n1 - 1 / n2)
        fixed = first["seconds"] - work / n1
        print(f"\nModel T(n) = {fixed:.2f} s + {work:.2f} s / n: " + ", ".join(
            f"{n} executors {fixed + work / n:.2f} s" for n in (8, 32, 128)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
