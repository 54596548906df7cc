"""Whether compaction's cost grows with the log: the time per message of a first compaction of 30M messages over
its time per message at 10M (keys a tenth of the messages), measured so that a shared machine's load falls on
both alike. Both stores are prepared once and their dirty pages written back (``os.sync``); each is compacted once
untimed (the first compaction after the appends ran slower in every early run of this bench); their compactions
then alternate (10M, 30M, 10M, ...) in this one process, with the compacted view removed between runs. Reported:
best and median wall seconds and CPU seconds (all threads) per message for each size, and 30M's over 10M's.

    .venv/bin/python -m bench.scaling [--distribution zipf-scattered] [--memory BYTES] [--repeat 4] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench import compaction, datasets, report
from bench.systems import TOPIC
from compactor import Compactor
from ledgerview.changelog import ChangelogSpec
from storage import Store

SIZES = ((10_000_000, 1_000_000), (30_000_000, 3_000_000))
"""(messages, keys) of the two datasets compared."""


def timed_compaction(target: Path) -> tuple[float, float]:
    """Wall and process CPU seconds of one first compaction of the store at ``target``; its view is removed after."""
    compaction.read_files_once(target)
    wall, cpu = time.perf_counter(), time.process_time()
    compaction.ledgerview_compact(target, target)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    state = compaction.compacted_state(target)
    assert state is not None
    shutil.rmtree(state)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--distribution", choices=["uniform", "zipf", "zipf-scattered"], default="uniform")
    parser.add_argument("--tombstones", type=float, default=0.01)
    parser.add_argument("--memory", type=int, default=None, help="compaction.memory.bytes (default: the topic's)")
    parser.add_argument("--repeat", type=int, default=4, help="compactions of each size")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    config = {} if args.memory is None else {"compaction.memory.bytes": args.memory}
    specs = [ChangelogSpec(messages=messages, keys=keys, distribution=args.distribution,
                           tombstone_share=args.tombstones) for messages, keys in SIZES]
    command = shlex.join(["python", "-m", "bench.scaling", *(argv if argv is not None else sys.argv[1:])])
    text = report.heading(["compaction-scaling"], " and ".join(datasets.describe(spec) for spec in specs), command,
                          args.repeat)
    with tempfile.TemporaryDirectory(prefix="ledgerview-scaling-", dir=datasets.DATA_DIR) as scratch:
        targets = []
        for number, spec in enumerate(specs):
            table = pa.ipc.open_file(pa.memory_map(str(datasets.ensure_dataset(spec)))).read_all()
            if number == 0:
                compaction.ledgerview_store(config)(table.slice(0, 20_000), spec, Path(scratch) / "warm-up")
            targets.append(Path(scratch) / f"{spec.messages}")
            compaction.ledgerview_store(config)(table, spec, targets[-1])
            del table
        with Store.open(Path(scratch) / "warm-up") as store:
            Compactor(store).compact(TOPIC)
        os.sync()
        for target in targets:
            timed_compaction(target)
        runs: dict[int, list[tuple[float, float]]] = {spec.messages: [] for spec in specs}
        for _ in range(args.repeat):
            for spec, target in zip(specs, targets, strict=True):
                runs[spec.messages].append(timed_compaction(target))
    rows, per_message = [], {}
    for spec in specs:
        walls, cpus = [wall for wall, _ in runs[spec.messages]], [cpu for _, cpu in runs[spec.messages]]
        per_message[spec.messages] = [figure / spec.messages for figure in
                                      (min(walls), statistics.median(walls), min(cpus), statistics.median(cpus))]
        rows.append((f"{spec.messages:,} / {spec.keys:,}", *(f"{figure * 1e9:.1f}" for figure in
                                                               per_message[spec.messages]),
                     " ".join(f"{wall:.3f}" for wall in walls)))
    small, large = (per_message[spec.messages] for spec in specs)
    rows.append(("30M over 10M", *(f"{big / little:.2f}x" for big, little in zip(large, small, strict=True)), ""))
    header = ("messages / keys", "wall ns/message, best", "wall, median", "CPU ns/message, best", "CPU, median",
              "every run's wall s")
    text += "\n\n" + report.markdown(header, rows)
    report.show(text, record_it=not args.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
