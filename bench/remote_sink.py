"""Issue 17: rows/s of the ledgerview Spark sink writing to an object store (``option("path", "s3://…")``:
executors upload segments, the driver commits by reference) beside Parquet written by the executors through
pyarrow in ``foreachBatch``, the same rows to the same S3 server (Spark's own S3A connector is not installed here).

Both are the same streaming query: a file source over Parquet input files on local disk (written untimed),
``maxFilesPerTrigger`` of them per micro-batch, ``trigger(availableNow=True)``, on ``local-cluster[2,1,1024]``
(two executors of one core each in processes of their own). The ledgerview query writes a topic created with
``RemoteStore.create_topic``; the Parquet query's ``foreachBatch`` runs ``mapInArrow`` so that each task writes
its rows as one Parquet file (pyarrow's defaults: snappy) to a fresh key and returns only its path and row
count. The server is moto's S3 server in a process of its own (bench/s3_server.py); its CPU seconds are given,
since on this machine it shares the two cores with Spark. The session starts untimed and each query runs once on
a small input untimed first (Python workers started, code imported); then the cases alternate, ``--repeat``
times each, timed from ``start()`` to the end of ``awaitTermination()``, checkpoint in a fresh folder.

Usage: python -m bench.remote_sink [--rows N] [--value-bytes B] [--files F] [--per-batch M] [--repeat R]
Prints a markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from bench.report import heading
from bench.s3_server import S3Server, s3_server
from storage.remote_store import RemoteStore

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4
KEYS = 100_000


def write_inputs(folder: Path, rows: int, value_bytes: int, files: int) -> None:
    """``rows`` rows (binary key ``k<i % KEYS>``, ``value_bytes`` random bytes) as ``files`` Parquet files whose
    modification times follow their order."""
    folder.mkdir(parents=True)
    generator = np.random.default_rng(7)
    size = -(-rows // files)
    for index in range(files):
        first, count = index * size, min(size, rows - index * size)
        keys = pa.array([f"k{i % KEYS}".encode() for i in range(first, first + count)], pa.binary())
        data = generator.integers(0, 256, count * value_bytes, dtype=np.uint8).tobytes()
        offsets = pa.array(np.arange(0, (count + 1) * value_bytes, value_bytes, dtype=np.int32))
        values = pa.BinaryArray.from_buffers(pa.binary(), count, [None, offsets.buffers()[1], pa.py_buffer(data)])
        path = folder / f"part-{index:05d}.parquet"
        pq.write_table(pa.table({"key": keys, "value": values}), path)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def stream(spark: SparkSession, source: Path, per_batch: int) -> DataFrame:
    return spark.readStream.schema("key binary, value binary").option("maxFilesPerTrigger", per_batch) \
        .parquet(str(source))


def ledgerview_sink(spark: SparkSession, server: S3Server, source: Path, per_batch: int, checkpoint: Path,
                    topic: str | None = None) -> tuple[int, int]:
    """The ledgerview sink into ``topic`` (default: a fresh one), created here; the rows and segment bytes its
    remote logs then hold."""
    topic = topic or f"sink-{uuid.uuid4().hex[:8]}"
    remote = RemoteStore.open(server.uri)
    remote.create_topic(topic, PARTITIONS)
    query = (stream(spark, source, per_batch).writeStream.format("ledgerview").option("path", server.uri)
             .option("topic", topic).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
             .start())
    query.awaitTermination()
    manifests = [remote.manifest(topic, partition) for partition in range(PARTITIONS)]
    return sum(m.end_offset for m in manifests), sum(m.size_bytes for m in manifests)


def parquet_task(uri: str, batch_id: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        filesystem, base = pafs.FileSystem.from_uri(uri)
        path, rows, writer = f"{base}/parquet/{batch_id:05d}-{uuid.uuid4().hex}.parquet", 0, None
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(filesystem.open_output_stream(path), batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
        yield pa.record_batch({"path": [path], "rows": [rows]})

    return write


def write_parquet(frame: DataFrame, uri: str, batch_id: int) -> list[tuple[str, int]]:
    """``frame`` written by its tasks as one Parquet file each under ``uri``; each file's path and rows."""
    rows = frame.mapInArrow(parquet_task(uri, batch_id), "path string, rows long").collect()
    return [(row["path"], row["rows"]) for row in rows]


def parquet_files(spark: SparkSession, server: S3Server, source: Path, per_batch: int, checkpoint: Path) -> (
    list[tuple[str, int]]
):
    """Parquet through pyarrow from the executors in foreachBatch; each file's path and rows."""
    written: list[tuple[str, int]] = []
    query = (stream(spark, source, per_batch).writeStream
             .foreachBatch(lambda frame, batch_id: written.extend(write_parquet(frame, server.uri, batch_id)))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return written


def parquet_sink(spark: SparkSession, server: S3Server, source: Path, per_batch: int, checkpoint: Path) -> (
    tuple[int, int]
):
    """Parquet through pyarrow from the executors in foreachBatch; the rows written and the bytes of the files."""
    written = parquet_files(spark, server, source, per_batch, checkpoint)
    filesystem, _ = pafs.FileSystem.from_uri(server.uri)
    return sum(rows for _, rows in written), sum(filesystem.get_file_info(path).size for path, _ in written)


CASES = {"ledgerview sink": ledgerview_sink, "parquet foreachBatch (pyarrow)": parquet_sink}


def arguments(module: str, doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of this bench and of those built on its data (bench/remote_scan.py)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=8, help="input Parquet files")
    parser.add_argument("--per-batch", type=int, default=2, help="input files per micro-batch")
    parser.add_argument("--repeat", type=int, default=2)
    return parser.parse_args(argv)


@contextlib.contextmanager
def cluster(args: argparse.Namespace, name: str) -> Iterator[tuple[SparkSession, S3Server, Path]]:
    """A fresh S3 server, the input files (``input``, and ``warm-up`` of 1,000 rows) in a scratch folder, and a
    ``local-cluster[2,1,1024]`` session whose executors reach the server; all gone at the end."""
    with tempfile.TemporaryDirectory(prefix=f"ledgerview-{name}-") as scratch, s3_server() as server:
        work = Path(scratch)
        write_inputs(work / "input", args.rows, args.value_bytes, args.files)
        write_inputs(work / "warm-up", 1_000, args.value_bytes, 2)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        from streaming import local_session  # after the AWS variables are set: the executors inherit them

        spark = local_session(name, master="local-cluster[2,1,1024]")
        try:
            yield spark, server, work
        finally:
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    args = arguments("bench.remote_sink", __doc__, argv)
    head = run_heading(args, "sink to S3", "bench.remote_sink")
    with cluster(args, "bench-remote-sink") as (spark, server, work):
        for case in CASES.values():
            case(spark, server, work / "warm-up", 1, work / f"warm-up-{uuid.uuid4().hex}")
        timings: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in CASES}
        for _ in range(args.repeat):
            for name, case in CASES.items():
                cpu, start = server.cpu_seconds(), time.perf_counter()
                rows, size = case(spark, server, work / "input", args.per_batch, work / f"ck-{uuid.uuid4().hex}")
                timings[name].append((time.perf_counter() - start, server.cpu_seconds() - cpu, rows, size))
                assert rows == args.rows, f"{name} wrote {rows} rows of {args.rows}"
    print(section(head, timings))
    return 0


def run_heading(args: argparse.Namespace, workload: str, module: str) -> list[str]:
    """The machine, versions, commit, data and command lines of bench/report.py's heading, taken now."""
    dataset = (f"{args.rows:,} rows of {args.value_bytes}-byte random values (binary keys of {KEYS:,}), "
               f"{args.files} Parquet input files, {args.per_batch} per micro-batch "
               f"({-(-args.files // args.per_batch)} batches), local-cluster[2,1,1024], moto S3 in a process of its "
               f"own, a topic of {PARTITIONS} partitions")
    command = f"python -m {module} --rows {args.rows} --value-bytes {args.value_bytes}"
    title, _, *lines = heading([workload], dataset, command, args.repeat).split("\n")
    return [f"- run: {title.removeprefix('## ').split(': ')[0]}", *lines]


def section(head: list[str], timings: dict[str, list[tuple[float, float, int, int]]]) -> str:
    lines = ["### Sink to S3", "", *head, "",
             "| system | seconds (best) | rows/s | MB/s written | runs (s) | bytes on S3 | S3 server CPU s |",
             "|---|---|---|---|---|---|---|"]
    for name, runs in timings.items():
        seconds, server_cpu, rows, size = min(runs)
        every = ", ".join(f"{run[0]:.2f}" for run in runs)
        lines.append(f"| {name} | {seconds:.2f} | {rows / seconds / 1e6:.2f} M | {size / seconds / 1e6:.0f} | "
                     f"{every} | {size / 1e6:.1f} MB | {server_cpu:.1f} |")
    return "\n".join(lines)

if __name__ == "__main__":
    sys.exit(main())
