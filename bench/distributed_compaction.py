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
from typing import Any

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


def run_spark(uri: str, executors: int) -> dict[str, Any]:
    """In a process of its own: start the cluster, then time the compaction; with Spark's event log of the run."""
    from streaming import local_session
    from streaming.compaction import compact_with_spark

    with tempfile.TemporaryDirectory(prefix="ledgerview-events-") as events:
        started = time.perf_counter()
        spark = local_session("ledgerview-bench", master=f"local-cluster[{executors},1,4096]", config={
            "spark.executor.memory": "3g", "spark.eventLog.enabled": "true", "spark.eventLog.dir": events,
            "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"})
        spark.sparkContext.parallelize(range(executors * 4), executors * 4).count()  # executors up
        ready = time.perf_counter()
        result = compact_with_spark(spark, uri, TOPIC)[0]
        done = time.perf_counter()
        spark.stop()
        [log] = Path(events).iterdir()
        stages = stage_measures(log.read_text().splitlines(), skip_first_job=True)
    return {"session_s": ready - started, "seconds": done - ready, "kept": result.messages_kept,
            "ledger_pieces": result.ledger_pieces, "key_index_pieces": result.key_index_pieces, "stages": stages}


def stage_measures(events: list[str], *, skip_first_job: bool) -> list[dict[str, float]]:
    """Per stage of the run, from Spark's event log: tasks, the sum of their executor run times (the work),
    the longest task, shuffle bytes written and read, and the stage's wall time."""
    stages: dict[int, dict[str, float]] = {}
    warm_up: set[int] = set()
    for line in events:
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerJobStart" and skip_first_job and event["Job ID"] == 0:
            warm_up.update(event["Stage IDs"])
        elif kind == "SparkListenerTaskEnd" and event["Stage ID"] not in warm_up:
            stage = stages.setdefault(event["Stage ID"], {"tasks": 0, "work_s": 0.0, "longest_s": 0.0,
                                                          "shuffle_write": 0, "shuffle_read": 0, "wall_s": 0.0})
            metrics = event["Task Metrics"]
            run_s = metrics["Executor Run Time"] / 1000
            stage["tasks"] += 1
            stage["work_s"] += run_s
            stage["longest_s"] = max(stage["longest_s"], run_s)
            stage["shuffle_write"] += metrics["Shuffle Write Metrics"]["Shuffle Bytes Written"]
            read = metrics["Shuffle Read Metrics"]
            stage["shuffle_read"] += read["Remote Bytes Read"] + read["Local Bytes Read"]
        elif kind == "SparkListenerStageCompleted" and event["Stage Info"]["Stage ID"] in stages:
            info = event["Stage Info"]
            stages[info["Stage ID"]]["wall_s"] = (info["Completion Time"] - info["Submission Time"]) / 1000
    return [stages[number] for number in sorted(stages)]


MIN_TASK_BYTES = 4 * 1024 * 1024
"""As streaming/compaction.py's task_count: a stage is cut into more tasks only while each gets this much."""
NETWORK_BYTES_PER_S = 1.25e9
"""Per executor (10 Gb/s): the share of shuffle bytes that crosses the network."""


def modelled_seconds(measured: dict[str, Any], executors: int) -> float:
    """The run's time with ``executors`` executors of one core, from one measured run on one executor: per stage
    its work divided over as many tasks as the stage can be cut into (at least MIN_TASK_BYTES of its input each,
    taken as its shuffle bytes or, for the first stage, the log), plus what does not shrink with executors: its
    longest task's excess over the average task (a Python worker's start, skew), the stage's own overhead (its
    wall time beyond its work) and shuffle bytes crossing the network; plus the driver's time outside stages."""
    stages = measured["stages"]
    driver_s = measured["seconds"] - sum(stage["wall_s"] for stage in stages)
    total = driver_s
    for stage in stages:
        moved = max(stage["shuffle_read"], stage["shuffle_write"], measured["input_bytes"] if stage is stages[0]
                    else 0)
        cuts = max(stage["tasks"], min(executors, moved // MIN_TASK_BYTES))
        overhead_s = max(0.0, stage["wall_s"] - stage["work_s"])
        excess_s = stage["longest_s"] - stage["work_s"] / stage["tasks"]
        network_s = stage["shuffle_read"] * (executors - 1) / executors / (executors * NETWORK_BYTES_PER_S)
        total += (stage["work_s"] - excess_s) / min(executors, cuts) + excess_s + overhead_s + network_s
    return float(total)


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
        with Store.open(folder, read_only=True) as store:
            input_bytes = store.size_bytes(TOPIC, 0)
        for executors in args.executors:
            uri = f"file://{work}/tier-{executors}"
            export_unowned(folder, uri)
            child = subprocess.run([sys.executable, "-m", "bench.distributed_compaction", "--run-spark", uri,
                                    str(executors)], capture_output=True, text=True)
            if child.returncode:
                raise SystemExit(f"the Spark run failed:\n{child.stderr[-3000:]}")
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
    measured = rows[0][1] | {"input_bytes": input_bytes}
    print(f"\nStages of the {rows[0][0]}-executor run (Spark's event log; work = the sum of its tasks' executor run "
          "times):\n\n| stage | tasks | work s | longest task s | wall s | shuffle written MB | shuffle read MB |\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    for number, stage in enumerate(measured["stages"]):
        print(f"| {number} | {stage['tasks']} | {stage['work_s']:.2f} | {stage['longest_s']:.2f} | "
              f"{stage['wall_s']:.2f} | {stage['shuffle_write'] / 1e6:.1f} | {stage['shuffle_read'] / 1e6:.1f} |")
    print("\nModelled from it: " + ", ".join(f"{n} executors {modelled_seconds(measured, n):.1f} s"
                                            for n in (1, 2, 8, 32, 128)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
