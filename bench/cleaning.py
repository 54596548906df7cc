"""The in-place cleaning workload: Kafka-style cleaning of a compacted topic (``Store.clean``), beside the floor of
copying the same segment files once, and Kafka's published cleaner figure.

A case is a preparer and a job, as in bench/compaction.py. The preparer appends the dataset to a fresh store whose
topic has cleanup.policy=compact (10,000-message appends, as the ``append`` workload) and rolls, so that every
segment is cleanable (the active segment never is); the job opens the store, runs one cleaning pass and closes it.
The cleaned segments are fsynced by the swap. The floor reads each segment file and writes it to a new file once,
fsynced: the least any in-place rewrite costs. A store is cleaned once: run with ``--repeat 1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa

from bench.compaction import MiB, Outcome, ledgerview_store
from bench.systems import TOPIC, fsync_path
from ledgerview.changelog import ChangelogSpec
from storage import Store
from storage.files import LOG_SUFFIX, parse_segment_file, partition_folder

CLEAN_CONFIG = {"cleanup.policy": "compact"}
KAFKA_FIGURE = "Kafka's published cleaner figure: 87 MB/s on a 100 MB __consumer_offsets segment (reference §6)"
COPY_BUFFER_BYTES = 16 * MiB


def cleanable_store(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """The dataset in a compacted topic, the active segment rolled so the whole log is cleanable."""
    ledgerview_store(CLEAN_CONFIG)(table, spec, target)
    with Store.open(target) as store:
        store.roll(TOPIC, 0)


def ledgerview_clean(target: Path, output: Path) -> Outcome:
    """Store.open, store.clean(topic), close."""
    with Store.open(target) as store:
        passes = store.clean(TOPIC)
    if not passes:
        raise RuntimeError(f"nothing was cleanable in {target}: a prepared store is cleaned once (--repeat 1)")
    [stats] = passes
    seconds = stats.seconds
    notes = (f"log {stats.bytes_read / 1e6:,.1f} MB -> {stats.bytes_written / 1e6:,.1f} MB, "
             f"{stats.bytes_read / seconds / 1e6:,.0f} MB/s of log; map {stats.map_seconds:.2f} s, "
             f"{stats.map_entries:,} keys ({stats.map_utilization:.0%} of the map); rewrite "
             f"{stats.clean_seconds:.2f} s; {stats.tombstones_removed} expired tombstones; {KAFKA_FIGURE}")
    return Outcome(stats.messages_read, stats.messages_written, passes=len(passes), output_bytes=stats.bytes_written,
                   notes=notes)


def copy_floor(target: Path, output: Path) -> Outcome:
    """Read each segment file once and write it to ``output`` once, fsynced."""
    output.mkdir()
    folder = partition_folder(target, TOPIC, 0)
    copied = 0
    for path in sorted(folder.iterdir()):
        parsed = parse_segment_file(path.name)
        if parsed is None or parsed[1:] != (LOG_SUFFIX, None):
            continue
        copy = output / path.name
        with open(path, "rb") as source, open(copy, "wb") as sink:
            shutil.copyfileobj(source, sink, COPY_BUFFER_BYTES)
            sink.flush()
            os.fsync(sink.fileno())
        copied += path.stat().st_size
    fsync_path(output)
    return Outcome(None, notes=f"{copied / 1e6:,.1f} MB of segment files copied")
