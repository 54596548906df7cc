"""One case of one workload, in a process of its own so its peak RSS is its own.

``python -m bench._run_one prepare|run WORKLOAD SYSTEM --dataset FILE --workdir DIR --out FILE.json``

``prepare`` runs the case's writer (read cases) or preparer (jobs) untimed; ``run`` times the writer, the reader
or the job ``--repeat`` times and writes the measurement as JSON to ``--out``. The parent (bench/__main__.py)
owns the work folder.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import resource
import shutil
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from bench import compaction, datasets
from bench.measurement import Measurement
from bench.workloads import Case, find

PROFILE_LINES = 30
WARM_UP_ROWS = 20_000
ANON_SAMPLE_SECONDS = 0.01


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM, the high-water mark of its own address space.

    Not getrusage's ru_maxrss: Linux carries that across exec, so a child would report at least the RSS of the
    parent that spawned it (the parent may have just generated a large dataset).
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def anon_rss_bytes() -> int:
    """RssAnon: the anonymous part of the resident set (heap, anonymous maps), without file pages."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class AnonSampler:
    """Samples anon_rss_bytes every ANON_SAMPLE_SECONDS in a thread and keeps the largest: VmHWM counts the file
    pages a memory-mapped reader touched, which the page cache can drop at any time; this does not."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="anon-rss-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(ANON_SAMPLE_SECONDS):
            self.peak_bytes = max(self.peak_bytes, anon_rss_bytes())

    def __enter__(self) -> AnonSampler:
        self.peak_bytes = anon_rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, anon_rss_bytes())


def children_peak_rss_bytes() -> int:
    """Sum of VmHWM over this process's live descendants (Spark's JVM and its children)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
    ours = {os.getpid()}
    grown = True
    while grown:
        found = {pid for pid, parent in parents.items() if parent in ours} - ours
        grown = bool(found)
        ours |= found
    total = 0
    for pid in ours - {os.getpid()}:
        try:
            with open(f"/proc/{pid}/status") as status:
                total += sum(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
        except OSError:
            continue
    return total


def find_case(workload: str, system: str) -> Case:
    for case in find(workload).cases:
        if case.system == system:
            return case
    raise KeyError(f"workload {workload!r} has no system {system!r}")


def prepare(case: Case, dataset: Path, workdir: Path) -> None:
    """Untimed: the writer's output for a read case; the preparer's input for a job (and a small one from the
    first WARM_UP_ROWS messages for its warm-up) or for a read case that has one."""
    table = datasets.load(dataset)
    if case.preparer is None:
        assert case.writer is not None
        case.writer(table, workdir / "target")
        return
    spec = datasets.read_spec(dataset)
    case.preparer(table, spec, workdir / "target")
    if case.job is not None:
        warm = min(WARM_UP_ROWS, table.num_rows)
        case.preparer(table.slice(0, warm), dataclasses.replace(spec, messages=warm), workdir / "warm-up")


def run(case: Case, dataset: Path, workdir: Path, repeat: int, profiler: cProfile.Profile | None) -> Measurement:
    if case.job is not None:
        return run_job(case, dataset, workdir, repeat, profiler)
    target = workdir / "target"
    table = datasets.load(dataset) if case.reader is None else None
    rss_before = current_rss_bytes()
    if case.reader is not None:
        case.reader(target)  # warm the page cache, lazy imports and first-call costs
    else:
        assert table is not None and case.writer is not None
        warm = workdir / "warm-up"
        case.writer(table.slice(0, WARM_UP_ROWS), warm)  # warm lazy imports (pyarrow's of pandas) and first calls
        shutil.rmtree(warm) if warm.is_dir() else warm.unlink()
    seconds = []
    messages = 0
    with AnonSampler() as anon:
        for _ in range(repeat):
            if profiler is not None:
                profiler.enable()
            start = time.perf_counter()
            if case.reader is None:
                assert table is not None and case.writer is not None
                case.writer(table, target)
                messages = table.num_rows
            else:
                messages = case.reader(target)
            seconds.append(time.perf_counter() - start)
            if profiler is not None:
                profiler.disable()
            if case.reader is None:
                shutil.rmtree(target) if target.is_dir() else target.unlink()
    return Measurement(seconds, messages, rss_before, peak_rss_bytes(), anon.peak_bytes, children_peak_rss_bytes())


def run_job(case: Case, dataset: Path, workdir: Path, repeat: int, profiler: cProfile.Profile | None) -> Measurement:
    """Warm up on the small input, read the input once (page cache), then time the job ``repeat`` times; the
    compacted state a ledgerview job changes is saved first and put back between repetitions, untimed."""
    assert case.job is not None
    target, output = workdir / "target", workdir / "output"
    case.job(workdir / "warm-up", output)  # imports, first calls, Spark's session start
    compaction.remove(output)
    compaction.read_files_once(target)
    state = compaction.compacted_state(target)
    saved = workdir / "saved-state"
    if state is not None and state.exists():
        shutil.copytree(state, saved)
    rss_before = current_rss_bytes()
    seconds = []
    outcome = compaction.Outcome(None)
    kept = output_bytes = None
    with AnonSampler() as anon:
        for repetition in range(repeat):
            if repetition and state is not None:
                compaction.remove(state)
                if saved.exists():
                    shutil.copytree(saved, state)
            if profiler is not None:
                profiler.enable()
            start = time.perf_counter()
            outcome = case.job(target, output)
            elapsed = time.perf_counter() - start
            if profiler is not None:
                profiler.disable()
            seconds.append(elapsed if outcome.seconds is None else outcome.seconds)
            if output.exists():
                kept, output_bytes = compaction.output_figures(output)
                if repetition < repeat - 1:
                    compaction.remove(output)
    peak_rss, children_peak_rss = peak_rss_bytes(), children_peak_rss_bytes()
    digest = compaction.view_digest(target, output)  # after the peaks are read: it loads the whole result
    compaction.remove(output)
    messages = outcome.messages if outcome.messages is not None else datasets.read_spec(dataset).messages
    return Measurement(
        seconds, messages, rss_before, peak_rss, anon.peak_bytes, children_peak_rss,
        kept=outcome.kept if outcome.kept is not None else kept, passes=outcome.passes,
        output_bytes=outcome.output_bytes if outcome.output_bytes is not None else output_bytes,
        index_bytes=outcome.index_bytes, digest=digest, notes=outcome.notes,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._run_one")
    parser.add_argument("phase", choices=["prepare", "run"])
    parser.add_argument("workload")
    parser.add_argument("system")
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions to stderr")
    args = parser.parse_args(argv)
    case = find_case(args.workload, args.system)
    if args.phase == "prepare":
        prepare(case, args.dataset, args.workdir)
        return
    profiler = cProfile.Profile() if args.profile else None
    measurement = run(case, args.dataset, args.workdir, args.repeat, profiler)
    if profiler is not None:
        print(f"\n--- cProfile: {args.workload} / {args.system}, top {PROFILE_LINES} by cumulative time ---",
              file=sys.stderr)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(PROFILE_LINES)
        print(f"\n--- cProfile: {args.workload} / {args.system}, top {PROFILE_LINES} by own time ---", file=sys.stderr)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(PROFILE_LINES)
    if args.out is not None:
        args.out.write_text(json.dumps(asdict(measurement)))


if __name__ == "__main__":
    main()
