"""How far below the fastest peer a first compaction can go: the fastest peer's own time split in two, beside the
floors of reading the input once and of writing the compacted view durably, all alternated in one process.

Issue 19 asks for a first compaction at most 0.5x the fastest of DuckDB, Polars and pyarrow (pyarrow on every row
so far). Every compactor that keeps a separate compacted ledger, as ledgerview's does (Pulsar's design), must
read every message's key once and then copy each surviving message's bytes into a new file and make it durable.
The pyarrow peer does exactly that in two steps: a hash aggregation of the keys' latest offsets, then a take of
those rows from each input batch and a write. Per round, each timed once, in this order:

- ledgerview: a first compaction of the store holding the dataset (``bench.scaling.timed_compaction``);
- ledgerview, no key index: the same with compaction.key.index false (the peers build no point-lookup index);
- pyarrow, whole: ``bench.compaction.pyarrow_job``;
- pyarrow, take and write: its second step alone, given the offsets (computed untimed);
- write floor: the bytes of pyarrow's result file written from one buffer in memory and fsynced (file and folder):
  what any durable copy of the survivors costs at least, with no gather and no encoding;
- read floor: the peers' input file memory-mapped and summed as 64-bit words (every byte touched once).

Reported per case: best and median seconds; and the shares of pyarrow's whole time they take. If the take and
write step alone is above half of pyarrow's time, no compactor that gathers the survivors with Arrow's take
meets the goal on that row.

    .venv/bin/python -m bench.compaction_floor --messages 10000000 --keys 1000000 --distribution zipf-scattered
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from bench import compaction, datasets, report
from bench.scaling import timed_compaction
from bench.systems import TOPIC, fsync_path
from ledgerview.changelog import ChangelogSpec
from storage import Store

CASES = ("ledgerview", "ledgerview, no key index", "pyarrow, whole", "pyarrow, take and write", "write floor",
         "read floor")


def _write_floor(data: bytes, output: Path) -> None:
    with open(output, "wb", buffering=0) as file:
        file.write(data)
        os.fsync(file.fileno())
    fsync_path(output.parent)


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _with_key_index(store: Path, key_index: bool) -> float:
    """A first compaction's wall seconds with compaction.key.index set as asked (set untimed)."""
    with Store.open(store) as opened:
        opened.alter_topic_config(TOPIC, {"compaction.key.index": key_index})
    return timed_compaction(store)[0]


def measure(spec: ChangelogSpec, repeat: int, scratch: Path) -> dict[str, list[float]]:
    """Each case's wall seconds over ``repeat`` alternated rounds, after one untimed round."""
    table = datasets.load(datasets.ensure_dataset(spec))
    store, peer_input = scratch / "store", scratch / "input.arrow"
    compaction.ledgerview_store()(table, spec, store)
    compaction.ipc_input(table, spec, peer_input)
    del table
    output = scratch / "output.arrow"
    offsets = compaction.pyarrow_latest_offsets(pa.ipc.open_file(pa.memory_map(str(peer_input))))
    os.sync()

    def take_and_write() -> None:
        compaction.pyarrow_write_latest(pa.ipc.open_file(pa.memory_map(str(peer_input))), offsets, output)

    compaction.pyarrow_job(peer_input, output)
    result = output.read_bytes()
    runs: dict[str, list[float]] = {case: [] for case in CASES}
    cases: dict[str, Callable[[], float]] = {
        "ledgerview": lambda: _with_key_index(store, True),
        "ledgerview, no key index": lambda: _with_key_index(store, False),
        "pyarrow, whole": lambda: _seconds(lambda: compaction.pyarrow_job(peer_input, output)),
        "pyarrow, take and write": lambda: _seconds(take_and_write),
        "write floor": lambda: _seconds(lambda: _write_floor(result, output)),
        "read floor": lambda: _seconds(lambda: compaction.sum_mapped(peer_input)),
    }
    for round_number in range(repeat + 1):
        for case, run in cases.items():
            seconds = run()
            if round_number:
                runs[case].append(seconds)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction_floor", description=__doc__.splitlines()[0])
    datasets.add_spec_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds, after one untimed")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    spec = datasets.spec_of(args)
    command = shlex.join(["python", "-m", "bench.compaction_floor", *(argv if argv is not None else sys.argv[1:])])
    text = report.heading(["compaction-floor"], datasets.describe(spec), command, args.repeat)
    with tempfile.TemporaryDirectory(prefix="ledgerview-floor-", dir=datasets.DATA_DIR) as scratch:
        runs = measure(spec, args.repeat, Path(scratch))
    whole = min(runs["pyarrow, whole"])
    rows: list[tuple[str, ...]] = [
        (case, f"{min(walls):.3f} ({statistics.median(walls):.3f})", f"{min(walls) / whole:.2f}")
        for case, walls in runs.items()]
    floors = min(runs["read floor"]) + min(runs["write floor"])
    rows.append(("read floor + write floor", f"{floors:.3f}", f"{floors / whole:.2f}"))
    text += "\n\n" + report.markdown(("case", "wall s, best (median)", "best over pyarrow's best"), rows)
    report.show(text, record_it=not args.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
