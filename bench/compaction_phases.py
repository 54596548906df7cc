"""Where a compaction's time goes, per phase and per step: one ledgerview compaction of a benchmark dataset with
its steps timed from outside (the compactor is not changed to be measured).

Each step is a function of the compactor or of storage wrapped for the run: its wall time, and the CPU time of
the thread that ran it. Phase one reads on one thread while workers (one per core) make and aggregate the
bucketed pairs, and the key index is written on a thread of its own while phase two runs, so the steps' wall
times add up to more than the run's; CPU seconds show what each step costs. Nested steps count in both.

    .venv/bin/python -m bench.compaction_phases --messages 10000000 --keys 1000000 --distribution zipf-scattered
"""

from __future__ import annotations

import argparse
import functools
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

import compactor.buckets
import compactor.latest_offsets
import compactor.replaced_rows
import compactor.run
import storage.key_index
import storage.ledger
import storage.partition_log
from bench import compaction, datasets, report
from bench.systems import APPEND_ROWS, TOPIC
from compactor import Compactor
from compactor.key_codes import KeyCoding
from ledgerview import changelog
from ledgerview.changelog import ChangelogSpec
from storage import Store
from storage.compacted import CompactedLedgers


class Steps:
    """Wall and thread-CPU seconds per (phase, step); the phase is the one the main thread is in."""

    def __init__(self) -> None:
        self.wall: dict[tuple[str, str], float] = defaultdict(float)
        self.cpu: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.phase = "set-up"
        self._lock = threading.Lock()

    def add(self, step: str, wall: float, cpu: float, phase: str | None = None) -> None:
        with self._lock:
            where = (phase or self.phase, step)
            self.wall[where] += wall
            self.cpu[where] += cpu
            self.calls[where] += 1

    def function(self, owner: Any, name: str, step: str, *, phase: str | None = None) -> None:
        """Time every call of ``owner.name`` as ``step``."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(step, time.perf_counter() - wall, time.thread_time() - cpu, phase)

        setattr(owner, name, timed)

    def generator(self, owner: Any, name: str, step: str) -> None:
        """Time each item that ``owner.name(...)`` yields (the work of making it) as ``step``."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
            items = iter(original(*args, **kwargs))
            while True:
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    self.add(step, time.perf_counter() - wall, time.thread_time() - cpu)
                yield item

        setattr(owner, name, timed)

    def phase_of(self, owner: Any, name: str, phase: str) -> None:
        """Calls of ``owner.name`` are ``phase``: their whole time is recorded as its step "whole phase"."""
        original: Callable[..., Any] = getattr(owner, name)

        @functools.wraps(original)
        def in_phase(*args: Any, **kwargs: Any) -> Any:
            before, self.phase = self.phase, phase
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.add("whole phase (process CPU: all threads)", time.perf_counter() - wall,
                         time.process_time() - cpu)
                self.phase = before

        setattr(owner, name, in_phase)


def instrument(steps: Steps) -> None:
    steps.phase_of(compactor.run, "find_survivors", "1: latest per key")
    steps.phase_of(compactor.run, "_write_ledger", "2: write the ledger")
    steps.generator(storage.partition_log.PartitionLog, "read_batches", "read raw batches (CRC-32C once per process)")
    steps.generator(storage.ledger.Ledger, "read_batches", "read the previous ledger's batches")
    steps.function(compactor.buckets, "keyed_numbers", "keys and 2*offset+live numbers (workers)")
    steps.function(KeyCoding, "encode", "key coding (workers)")
    steps.function(KeyCoding, "hashes", "key fingerprints for the buckets (workers)")
    steps.function(compactor.latest_offsets, "bucketed", "pairs cut into buckets, all of it (workers)")
    steps.function(compactor.buckets, "latest_per_key", "aggregation while reading: reductions (workers)")
    steps.function(compactor.latest_offsets, "latest_per_key", "aggregation of each bucket at the end (workers)")
    steps.function(compactor.replaced_rows.ReplacedRows, "mark", "read the view's keys, mark those replaced",
                   phase="layered: replaced rows (own thread)")
    steps.function(compactor.run, "_take", "take the surviving rows")
    steps.function(storage.ledger.LedgerWriter, "append", "encode, checksum and write ledger batches")
    steps.function(storage.ledger.LedgerWriter, "finish", "fsync the ledger", phase="3: finish")
    steps.function(compactor.latest_offsets.LiveKeys, "sorted_by_key", "key index: sort the survivors by key",
                   phase="key index (own thread)")
    steps.function(storage.key_index.KeyIndexWriter, "add_sorted_run", "key index: write the SST run",
                   phase="key index (own thread)")
    steps.function(storage.key_index.KeyIndexWriter, "finish", "key index: ingest into RocksDB, fsync",
                   phase="3: finish")
    steps.function(CompactedLedgers, "publish", "publish the cursor", phase="3: finish")


def measure(spec: ChangelogSpec, config: Mapping[str, object], *, incremental: bool, append_messages: int
            ) -> tuple[Steps, float, float]:
    """One compaction of ``spec``'s dataset in a fresh store, appended ``append_messages`` at a time, after an
    untimed one of a small prefix (imports and first calls); returns the steps, the run's wall and process CPU
    seconds. ``incremental``: the dataset is compacted untimed first, the incremental workload's new messages
    appended, and the second run measured."""
    dataset = datasets.ensure_dataset(spec)
    table = pa.ipc.open_file(pa.memory_map(str(dataset))).read_all()
    with tempfile.TemporaryDirectory(prefix="ledgerview-phases-", dir=datasets.DATA_DIR) as scratch:
        warm, target = Path(scratch) / "warm", Path(scratch) / "target"
        prepare = compaction.ledgerview_store(config, append_messages=append_messages)
        prepare(table.slice(0, 20_000), spec, warm)
        prepare(table, spec, target)
        del table
        with Store.open(warm) as store:
            Compactor(store).compact(TOPIC)
        shutil.rmtree(warm)
        if incremental:
            with Store.open(target) as store:
                Compactor(store).compact(TOPIC)
                compaction.append_table(store, changelog.generate(compaction.new_messages_spec(spec)), append_messages)
        compaction.read_files_once(target)
        steps = Steps()
        instrument(steps)
        wall, cpu = time.perf_counter(), time.process_time()
        with Store.open(target) as store:
            Compactor(store).compact(TOPIC)
        return steps, time.perf_counter() - wall, time.process_time() - cpu


def table_of(steps: Steps, wall: float, cpu: float) -> str:
    rows: list[tuple[str, ...]] = [(phase, step, f"{steps.calls[phase, step]:,}", f"{steps.wall[phase, step]:.3f}",
             f"{steps.cpu[phase, step]:.3f}") for phase, step in sorted(steps.wall)]
    rows.append(("whole run", "Store.open, compact, close", "1", f"{wall:.3f}", f"{cpu:.3f}"))
    return report.markdown(("phase", "step", "calls", "wall s", "CPU s"), rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction_phases", description=__doc__.splitlines()[0])
    datasets.add_spec_arguments(parser)
    parser.add_argument("--memory", type=int, default=None, help="compaction.memory.bytes (default: the topic's)")
    parser.add_argument("--incremental", action="store_true",
                        help="measure the run after the first, with the incremental workload's new messages")
    parser.add_argument("--append-messages", type=int, default=APPEND_ROWS,
                        help="messages per append, so per stored batch (default %(default)s)")
    parser.add_argument("--no-key-index", action="store_true", help="compaction.key.index false")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    spec = datasets.spec_of(args)
    config: dict[str, object] = {} if args.memory is None else {"compaction.memory.bytes": args.memory}
    if args.no_key_index:
        config["compaction.key.index"] = False
    command = shlex.join(["python", "-m", "bench.compaction_phases", *(argv if argv is not None else sys.argv[1:])])
    text = report.heading(["compaction-phases"], datasets.describe(spec), command, 1)
    steps, wall, cpu = measure(spec, config, incremental=args.incremental, append_messages=args.append_messages)
    text += "\n\n" + table_of(steps, wall, cpu)
    report.show(text, record_it=not args.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
