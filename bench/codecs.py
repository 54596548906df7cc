"""Bytes on disk and what compression.type costs: one dataset stored by ledgerview uncompressed, lz4 and zstd,
beside Arrow IPC and Parquet (pyarrow's defaults: snappy, dictionary encoding), with the time to append, to scan
and (ledgerview) to compact each.

``python -m bench.codecs [--messages N] [--keys K] [--value-bytes B] [--ticks] [--repeat R]``

- append: the ``append`` workload's writers (bench/systems.py: 10,000-message appends, flush; IPC and Parquet
  files fsynced), into a fresh target each repetition;
- scan: the ``read`` workload's readers (``store.read(topic, 0)`` with CRC-32C checks; IPC ``read_all`` over a
  memory map; ``pq.read_table``), page cache warm;
- compact: ``Store.open``, ``Compactor(store).compact(topic)`` (default config; ledger in the topic's codec, key
  index, cursor, fsynced), close, on a fresh copy of the appended store each repetition (copied untimed);
- bytes: every file the writer left (a store: segments, indexes, checkpoints, metadata), and the compacted
  ledger.

Everything runs in this one process, the systems interleaved within each repetition so that other work on the
machine weighs on all of them alike; the best and the median of ``--repeat`` are printed. ``--ticks`` takes the
demo's small rows instead (``ledgerview.changelog.price_ticks``: 300 symbols, 7-byte keys, decimal-text values of
about 6 bytes, 10 ms apart) of the bench changelog (``--keys`` keys of 10 bytes, ``--value-bytes`` random bytes).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from bench import datasets, systems
from compactor import Compactor
from ledgerview.changelog import ChangelogSpec, price_ticks
from storage import Store

LEDGERVIEW_CODECS = ("uncompressed", "lz4", "zstd")
TICK_SYMBOLS = 300


@dataclass
class Figures:
    system: str
    bytes: int = 0
    ledger_bytes: int | None = None
    append: list[float] = field(default_factory=list)
    scan: list[float] = field(default_factory=list)
    compact: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class System:
    name: str
    writer: systems.Writer
    reader: systems.Reader
    compacts: bool


SYSTEMS = (
    *(System(f"ledgerview {codec}", systems.ledgerview_writer(codec), systems.ledgerview_read, True)
      for codec in LEDGERVIEW_CODECS),
    System("arrow ipc file", systems.ipc_write, systems.ipc_read, False),
    System("parquet", systems.parquet_write, systems.parquet_read, False),
)


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def compact(target: Path) -> int:
    """Compact the store at ``target``; returns the bytes of the ledger written."""
    with Store.open(target) as store:
        [result] = Compactor(store).compact(systems.TOPIC)
    ledgers = list((target / f"{systems.TOPIC}-0" / "compacted").glob("*.ledger"))
    assert len(ledgers) == 1, f"expected one ledger after {result}, found {ledgers}"
    return ledgers[0].stat().st_size


def measure(table: pa.Table, repeat: int, workdir: Path) -> list[Figures]:
    figures = {system.name: Figures(system.name) for system in SYSTEMS}
    for system in SYSTEMS:  # warm imports and first calls, untimed
        warm = workdir / f"warm-{system.name}"
        system.writer(table.slice(0, 20_000), warm)
        system.reader(warm)
        shutil.rmtree(warm) if warm.is_dir() else warm.unlink()
    for _ in range(repeat):
        for system in SYSTEMS:
            row = figures[system.name]
            target = workdir / system.name.replace(" ", "-")
            row.append.append(timed(lambda: system.writer(table, target)))  # noqa: B023 (called at once)
            row.bytes = systems.bytes_on_disk(target)
            system.reader(target)  # page cache warm
            row.scan.append(timed(lambda: system.reader(target)))  # noqa: B023
            if system.compacts:
                copy = workdir / "compacting"
                shutil.copytree(target, copy)
                start = time.perf_counter()
                row.ledger_bytes = compact(copy)
                row.compact.append(time.perf_counter() - start)
                shutil.rmtree(copy)
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    return list(figures.values())


def _seconds(values: list[float]) -> str:
    return f"{min(values):.3f} ({statistics.median(values):.3f})" if values else ""


def _size(size_bytes: int) -> str:
    return f"{size_bytes / 1e6:,.1f} MB" if size_bytes >= 1e6 else f"{size_bytes / 1e3:,.1f} kB"


def report(rows: list[Figures], payload_bytes: int) -> str:
    parquet = next(row for row in rows if row.system == "parquet")
    ipc = next(row for row in rows if row.system == "arrow ipc file")
    lines = [
        "| system | bytes on disk | x parquet | append s, best (median) | x ipc append | scan s | compact s | "
        "ledger bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.system} | {row.bytes / 1e6:,.1f} MB | {row.bytes / parquet.bytes:.2f} | {_seconds(row.append)} | "
            f"{min(row.append) / min(ipc.append):.2f} | {_seconds(row.scan)} | {_seconds(row.compact)} | "
            f"{'' if row.ledger_bytes is None else _size(row.ledger_bytes)} |")
    lines.append(f"\nkey + value bytes of the input: {payload_bytes / 1e6:,.1f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.codecs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--ticks", action="store_true", help="the demo's price ticks instead of the bench changelog")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.ticks:
        table = price_ticks(TICK_SYMBOLS, args.messages)
        described = f"price ticks: {args.messages:,} messages, {TICK_SYMBOLS} symbols"
    else:
        spec = ChangelogSpec(messages=args.messages, keys=args.keys, value_bytes=args.value_bytes)
        table = datasets.load(datasets.ensure_dataset(spec))
        described = datasets.describe(spec)
    payload = sum(int(pa.compute.sum(pa.compute.binary_length(table[name])).as_py() or 0) for name in ("key", "value"))
    with tempfile.TemporaryDirectory(dir=datasets.DATA_DIR) as workdir:
        rows = measure(table, args.repeat, Path(workdir))
    print(f"dataset: {described}; repeat {args.repeat}\n")
    print(report(rows, payload))


if __name__ == "__main__":
    main()
