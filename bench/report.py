"""Rows of figures, the results table, and the heading that says where and on what they were measured."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.measurement import Measurement
from bench.workloads import Goal, Workload

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
RESULTS_INTRO = """# Benchmark results

Appended by `python -m bench` (see [README.md](README.md)); newest at the bottom. Each run's heading names the
machine, versions, commit and dataset. Columns: seconds is the best of the run's repetitions; messages/s and MB/s
(10^6 bytes of key + value input) follow from it; "x ledgerview" is the row's messages/s divided by the first
ledgerview row's of the same workload (above 1: faster than ledgerview); peak RSS is the process's peak resident
set size (each case runs in a fresh process), RSS before is what it held before the case's work began (for the
append cases, the input table). Runs of the compaction workloads add a second table: messages read and kept,
phase-one passes, result and key-index bytes, and peak anonymous RSS (without the file pages of memory maps).
"""


@dataclass(frozen=True)
class Row:
    workload: str
    system: str
    messages: int
    seconds: float
    """Best of the repetitions."""
    messages_per_s: float
    mb_per_s: float
    ratio: float
    """This row's messages/s over the workload's baseline (first row)."""
    peak_rss_bytes: int
    """The process's peak RSS plus its descendants' (Spark's JVM)."""
    rss_before_bytes: int
    notes: str
    peak_anon_bytes: int = 0
    kept: int | None = None
    passes: int | None = None
    output_bytes: int | None = None
    index_bytes: int | None = None
    digest: str | None = None
    notes_only: bool = False
    """A row that only carries notes, no figures: a warning, or how a workload's goal came out."""


def make_rows(workload: Workload, results: list[tuple[str, str, Measurement]], payload: int) -> list[Row]:
    """``results``: (system, note, measurement) per case, the baseline first; ``payload``: key+value bytes of the
    dataset (a workload whose cases handle other messages gets MB/s in proportion to its messages)."""
    rows: list[Row] = []
    baseline = baseline_seconds = 0.0
    for system, note, m in results:
        best = min(m.seconds)
        rate = m.messages / best
        baseline = baseline or rate
        baseline_seconds = baseline_seconds or best
        notes = [part for part in (note, m.notes) if part]
        if workload.time_vs_first and rows:
            notes.append(f"time x{best / baseline_seconds:.2f} the first row's")
        if m.children_peak_rss_bytes:
            notes.append(f"peak RSS includes child processes' (the JVM's) {_gib(m.children_peak_rss_bytes)}")
        if len(m.seconds) > 1:
            notes.append(f"best of {len(m.seconds)}, median {statistics.median(m.seconds):.3f} s")
        mb = payload * (1 if workload.whole_dataset else 0) / best / 1e6
        rows.append(Row(workload.name, system, m.messages, best, rate, mb, rate / baseline,
                        m.peak_rss_bytes + m.children_peak_rss_bytes, m.rss_before_bytes, "; ".join(notes),
                        m.peak_anon_bytes, m.kept, m.passes, m.output_bytes, m.index_bytes, m.digest))
    kept = {row.system: row.kept for row in rows if row.kept is not None}
    if workload.same_result and len(set(kept.values())) > 1:
        listed = ", ".join(f"{system} {count:,}" for system, count in kept.items())
        rows.append(Row(workload.name, "WARNING", 0, 0.0, 0.0, 0.0, 0.0, 0, 0,
                        f"the systems kept different numbers of messages: {listed}", notes_only=True))
    digests = {row.system: row.digest for row in rows if row.digest is not None}
    if workload.same_result and len(set(digests.values())) > 1:
        listed = ", ".join(f"{system} {digest}" for system, digest in digests.items())
        rows.append(Row(workload.name, "WARNING", 0, 0.0, 0.0, 0.0, 0.0, 0, 0,
                        f"the systems' results differ (view digests): {listed}", notes_only=True))
    return rows + [_goal_row(workload.name, goal, rows) for goal in workload.goals
                   if {goal.system, *goal.parts} <= {row.system for row in rows}]


def _goal_row(workload: str, goal: Goal, rows: list[Row]) -> Row:
    """A row whose notes give ``goal.system``'s time over the sum of ``goal.parts``' times, and whether it is at
    most ``goal.factor``."""
    seconds = {row.system: row.seconds for row in rows}
    ratio = seconds[goal.system] / sum(seconds[part] for part in goal.parts)
    parts = " + ".join(f"{part} {seconds[part]:.3f} s" for part in goal.parts)
    notes = f"{goal.system} {seconds[goal.system]:.3f} s / ({parts}) = {ratio:.2f}"
    if goal.factor is not None:
        notes += f"; goal <= {goal.factor:g}: {'met' if ratio <= goal.factor else 'NOT met'}"
    return Row(workload, "goal" if goal.factor is not None else "ratio", 0, 0.0, 0.0, 0.0, 0.0, 0, 0, notes,
               notes_only=True)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _rate(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 1e5 else f"{value:,.0f}"


COLUMNS = ("workload", "system", "messages", "seconds", "messages/s", "MB/s", "x ledgerview", "peak RSS",
           "RSS before", "notes")


def markdown(header: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    cells = [header, *body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"
             for row in cells]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    return markdown(COLUMNS, [
        (r.workload, r.system, *[""] * (len(COLUMNS) - 3), r.notes) if r.notes_only else
        (r.workload, r.system, f"{r.messages:,}", f"{r.seconds:.3f}", _rate(r.messages_per_s),
         f"{r.mb_per_s:,.0f}" if r.mb_per_s else "", f"{r.ratio:.2f}", _gib(r.peak_rss_bytes),
         _gib(r.rss_before_bytes), r.notes)
        for r in rows
    ])


OUTPUT_COLUMNS = ("workload", "system", "messages read", "kept", "passes", "result bytes", "key index bytes",
                  "bytes per kept message", "view digest", "peak anon RSS", "peak RSS")


def _mb(size: int | None) -> str:
    return "" if size is None else f"{size / 1e6:,.1f} MB"


def output_table(rows: list[Row]) -> str:
    """The results of the rows that produced one (compaction jobs): what was kept, its size, and memory without
    the file pages of memory maps (peak anon RSS)."""
    return markdown(OUTPUT_COLUMNS, [
        (r.workload, r.system, f"{r.messages:,}", f"{r.kept:,}", "" if r.passes is None else str(r.passes),
         _mb(r.output_bytes), _mb(r.index_bytes),
         f"{((r.output_bytes or 0) + (r.index_bytes or 0)) / r.kept:,.1f}" if r.kept else "",
         r.digest or "", _gib(r.peak_anon_bytes), _gib(r.peak_rss_bytes))
        for r in rows if r.kept is not None and not r.notes_only
    ])


def _versions(*packages: str) -> str:
    found = []
    for package in packages:
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory() -> str:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return _gib(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return "unknown memory"


def _load_average() -> str:
    try:
        with open("/proc/loadavg") as loadavg:
            return " ".join(loadavg.read().split()[:3])
    except OSError:
        return "unknown"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def commit() -> str:
    """Short HEAD, and the tracked files that differ from it (the benchmark measures the working tree)."""
    head = (_git("rev-parse", "--short", "HEAD") or "").strip()
    if not head:
        return "unknown (no git)"
    changed = (_git("status", "--porcelain", "--untracked-files=no") or "").splitlines()
    if not changed:
        return head
    names = [line[3:] for line in changed]
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return f"{head} with uncommitted changes to {shown}"


def heading(workloads: list[str], dataset: str, command: str, repeat: int) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        f"## {now}: {', '.join(workloads)}",
        "",
        f"- machine: nproc {len(os.sched_getaffinity(0))}, {_memory()} memory, {_cpu_model()}; "
        f"load average {_load_average()} at the start (other work on the machine skews the figures)",
        f"- Python {platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}; "
        f"{_versions('duckdb', 'polars', 'pyspark', 'rocksdict')}",
        f"- commit: {commit()}",
        f"- dataset: {dataset}",
        f"- command: `{command}` (repeat {repeat})",
    ])


def record(text: str) -> None:
    """Append a run (heading and table) to RESULTS.md, creating it with its introduction if missing."""
    if not RESULTS.exists():
        RESULTS.write_text(RESULTS_INTRO)
    with RESULTS.open("a") as results:
        results.write("\n" + text + "\n")


def show(text: str, *, record_it: bool) -> None:
    """Print a run's text and, when ``record_it``, append it to RESULTS.md."""
    print(text)
    if record_it:
        record(text)
