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

from bench.compaction import Job, MiB, Outcome, ledgerview_store
from bench.systems import TOPIC, fsync_path
from ledgerview.changelog import ChangelogSpec
from storage import Store
from storage.cleaner import CleanerStats
from storage.cleaner_manager import CleanerConfig
from storage.files import LOG_SUFFIX, parse_segment_file, partition_folder

CLEAN_CONFIG = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"}
"""Ratio 0: a pass runs while any byte is dirty, so every case ends with the log fully cleaned."""
KAFKA_FIGURE = "Kafka's published cleaner figure: 87 MB/s on a 100 MB __consumer_offsets segment (reference §6)"
COPY_BUFFER_BYTES = 16 * MiB
SMALL_BUDGET_MIB = 32


def cleanable_store(table: pa.Table, spec: ChangelogSpec, target: Path) -> None:
    """The dataset in a compacted topic, the active segment rolled so the whole log is cleanable."""
    ledgerview_store(CLEAN_CONFIG)(table, spec, target)
    with Store.open(target) as store:
        store.roll(TOPIC, 0)


def ledgerview_clean(budget_bytes: int | None = None) -> Job:
    """Store.open (with a key-map budget of ``budget_bytes``, default the cleaner's), ``store.clean(topic)`` until
    nothing is left to clean (one pass when the map holds every key), close."""

    def job(target: Path, output: Path) -> Outcome:
        config = CleanerConfig() if budget_bytes is None else CleanerConfig(dedupe_buffer_bytes=budget_bytes)
        passes: list[CleanerStats] = []
        with Store.open(target, cleaner_config=config) as store:
            while cleaned := store.clean(TOPIC):
                passes += cleaned
        if not passes:
            raise RuntimeError(f"nothing was cleanable in {target}: a prepared store is cleaned once (--repeat 1)")
        seconds = sum(stats.seconds for stats in passes)
        read = sum(stats.bytes_read for stats in passes)
        last = passes[-1]
        notes = (f"log {passes[0].bytes_read / 1e6:,.1f} MB -> {last.bytes_written / 1e6:,.1f} MB, "
                 f"{read / seconds / 1e6:,.0f} MB/s of log read; map {sum(s.map_seconds for s in passes):.2f} s, "
                 f"{passes[0].map_entries:,} keys in the first pass's map ({passes[0].map_utilization:.0%}); rewrite "
                 f"{sum(s.clean_seconds for s in passes):.2f} s; {KAFKA_FIGURE}")
        return Outcome(None, last.messages_written, passes=len(passes),
                       output_bytes=last.bytes_written, notes=notes)

    return job


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
