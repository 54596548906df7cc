"""How compaction's time and memory grow: the ``compact`` workload's ledgerview case and the fastest peers over
two series of datasets, in one run, plotted.

- against messages: 1M, 3M, 10M and 30M messages with keys one tenth of the messages;
- against distinct keys: 10M messages over 200k, 500k, 1M, 2M and 5M keys.

Every point is one run of each case (prepared untimed in its own process, as ``python -m bench compact`` runs
it); a case that fails is left out of the table and the plots, its error printed. The figures go to RESULTS.md
as one table, the points to ``bench/plots/compact-sweep-<distribution>.json`` and the plots (seconds and peak
anonymous RSS against each series, log-log) beside them as PNG files.

    .venv/bin/python -m bench.sweep [--distribution zipf-scattered] [--tombstones 0.01] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import datasets, report
from bench.__main__ import run_case
from bench.workloads import find
from ledgerview.changelog import ChangelogSpec

PLOTS = Path(__file__).resolve().parent / "plots"
MESSAGE_SERIES = (1_000_000, 3_000_000, 10_000_000, 30_000_000)
"""Messages of the first series; each with a tenth as many keys."""
KEY_SERIES = (200_000, 500_000, 1_000_000, 2_000_000, 5_000_000)
KEY_SERIES_MESSAGES = 10_000_000
OURS = ("ledgerview", "ledgerview 1 GiB")
"""ledgerview with the default compaction.memory.bytes (256 MiB) and with the larger budget docs/compaction.md
names."""
PEERS = ("pyarrow", "duckdb arg_max", "polars")
"""The peers that were fastest in the ``compact`` runs (the other DuckDB queries and Spark SQL were slower at
every size measured)."""
SYSTEMS = OURS + PEERS


@dataclass(frozen=True)
class Point:
    series: str
    """"messages" or "keys": which series the point belongs to (the 10M/1M dataset is in both)."""
    messages: int
    keys: int
    system: str
    seconds: float
    peak_anon_bytes: int
    peak_rss_bytes: int
    kept: int | None
    digest: str | None


def datasets_to_run() -> list[tuple[str, int, int]]:
    """(series, messages, keys) of every point, each dataset once."""
    points = [("messages", messages, messages // 10) for messages in MESSAGE_SERIES]
    points += [("keys", KEY_SERIES_MESSAGES, keys) for keys in KEY_SERIES
               if (KEY_SERIES_MESSAGES, keys) not in {(m, k) for _, m, k in points}]
    return points


def measure(args: argparse.Namespace) -> list[Point]:
    workload = find("compact")
    cases = [case for case in workload.cases if case.system in SYSTEMS]
    points = []
    for series, messages, keys in datasets_to_run():
        spec = ChangelogSpec(messages=messages, keys=keys, distribution=args.distribution,
                             tombstone_share=args.tombstones)
        print(f"dataset: {datasets.describe(spec)}", file=sys.stderr, flush=True)
        dataset = datasets.ensure_dataset(spec)
        for case in cases:
            print(f"  {case.system} ...", file=sys.stderr, flush=True)
            try:
                m = run_case(workload, case, dataset, repeat=1, profile=False)
            except subprocess.CalledProcessError as error:  # its error is above; the other points still count
                print(f"  {case.system} failed (exit {error.returncode})", file=sys.stderr, flush=True)
                continue
            points.append(Point(series, messages, keys, case.system, min(m.seconds), m.peak_anon_bytes,
                                m.peak_rss_bytes + m.children_peak_rss_bytes, m.kept, m.digest))
        if args.remove_datasets:
            dataset.unlink()
    return points


def in_series(points: list[Point], series: str) -> list[Point]:
    """The points of one series; the 10M-message, 1M-key dataset belongs to both."""
    return [p for p in points if p.series == series or
            (series == "keys" and p.messages == KEY_SERIES_MESSAGES and p.keys == KEY_SERIES_MESSAGES // 10)]


def plot(points: list[Point], distribution: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(exist_ok=True)
    written = []
    for series, x_label in (("messages", "messages (keys = messages / 10)"),
                            ("keys", f"distinct keys ({KEY_SERIES_MESSAGES:,} messages)")):
        chosen = in_series(points, series)
        figure, (seconds_axes, memory_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
        for system in SYSTEMS:
            mine = sorted((p for p in chosen if p.system == system), key=lambda p: getattr(p, series))
            xs = [getattr(p, series) for p in mine]
            seconds_axes.plot(xs, [p.seconds for p in mine], marker="o", label=system)
            memory_axes.plot(xs, [p.peak_anon_bytes / 2**20 for p in mine], marker="o", label=system)
        for axes, y_label in ((seconds_axes, "seconds"), (memory_axes, "peak anonymous RSS (MiB)")):
            axes.set_xscale("log")
            axes.set_yscale("log")
            axes.set_xlabel(x_label)
            axes.set_ylabel(y_label)
            axes.grid(True, which="both", alpha=0.3)
        seconds_axes.legend()
        figure.suptitle(f"compaction against {series}: {distribution}, 100-byte values")
        figure.tight_layout()
        path = PLOTS / f"compact-sweep-{distribution}-{series}.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written


def summary(points: list[Point]) -> str:
    """One row per dataset: each system's seconds and peak anonymous RSS; for each ledgerview case, its time over
    the fastest peer's and its time per message over its own at 10M messages and 1M keys."""
    datasets_seen = sorted({(p.messages, p.keys) for p in points})
    by = {(p.messages, p.keys, p.system): p for p in points}
    reference = (KEY_SERIES_MESSAGES, KEY_SERIES_MESSAGES // 10)
    columns = ("messages", "keys", *(f"{s} s / MiB" for s in SYSTEMS),
               *(f"{s} x fastest peer" for s in OURS), *(f"{s} time per message x 10M's" for s in OURS), "same view")
    rows = []
    for messages, keys in datasets_seen:
        mine = [by[messages, keys, s] for s in SYSTEMS if (messages, keys, s) in by]
        peers = [p for p in mine if p.system in PEERS]
        fastest = min(peers, key=lambda p: p.seconds) if peers else None
        ours = [by.get((messages, keys, s)) for s in OURS]
        references = [by.get((*reference, s)) for s in OURS]
        rows.append((
            f"{messages:,}", f"{keys:,}",
            *(f"{by[messages, keys, s].seconds:.3f} / {by[messages, keys, s].peak_anon_bytes / 2**20:,.0f}"
              if (messages, keys, s) in by else "" for s in SYSTEMS),
            *(f"{p.seconds / fastest.seconds:.2f} ({fastest.system})" if p and fastest else "" for p in ours),
            *(f"{p.seconds / messages / (r.seconds / r.messages):.2f}" if p and r else ""
              for p, r in zip(ours, references, strict=True)),
            "yes" if len({p.digest for p in mine}) == 1 else "NO: " + ", ".join(f"{p.system} {p.digest}" for p in mine),
        ))
    return report.markdown(columns, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--distribution", choices=["uniform", "zipf", "zipf-scattered"], default="uniform")
    parser.add_argument("--tombstones", type=float, default=0.01)
    parser.add_argument("--no-record", action="store_true", help="print only; no RESULTS.md, JSON or plots")
    parser.add_argument("--remove-datasets", action="store_true",
                        help="delete each cached dataset after its point (the 30M one takes 3.3 GB)")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "bench.sweep", *(argv if argv is not None else sys.argv[1:])])
    started = time.perf_counter()
    text = report.heading(["compact-sweep"], f"{args.distribution}, 100-byte values, {args.tombstones:.1%} "
                          "tombstones, seed 7; messages and keys per row", command, 1)
    points = measure(args)
    text += "\n\n" + summary(points)
    print(text)
    print(f"\n(wall time {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if not args.no_record:
        PLOTS.mkdir(exist_ok=True)
        data = PLOTS / f"compact-sweep-{args.distribution}.json"
        data.write_text(json.dumps([asdict(p) for p in points], indent=1) + "\n")
        plots = plot(points, args.distribution)
        text += "\n\nPlots: " + ", ".join(f"[{p.name}](plots/{p.name})" for p in plots) + f"; points: plots/{data.name}"
        report.record(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
