"""``python -m bench [workload ...]``: generate or reuse the dataset, run each case in its own process, print the
table and append it to bench/RESULTS.md."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import datasets, report
from bench.measurement import Measurement
from bench.remote import REMOTE_MESSAGES
from bench.workloads import DEFAULT_MESSAGES, WORKLOADS, Case, Workload, find
from ledgerview.changelog import ChangelogSpec


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="ledgerview benchmarks, side by side with Arrow IPC, Parquet, DuckDB, Polars, pyarrow, Spark.",
        epilog="workloads: " + "; ".join(f"{w.name}: {w.description}" for w in WORKLOADS.values()),
    )
    parser.add_argument("workloads", nargs="*", metavar="workload", help=f"default: all ({', '.join(WORKLOADS)})")
    parser.add_argument("--messages", type=int, default=None,
                        help=f"default: each workload's own ({DEFAULT_MESSAGES:,}; remote-*: {REMOTE_MESSAGES:,})")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--distribution", choices=["uniform", "zipf", "zipf-scattered"], default="uniform")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=0.0, help="share of tombstones, 0 to 1")
    parser.add_argument("--repeat", type=int, default=1, help="timed repetitions per case; the best is reported")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to bench/RESULTS.md")
    parser.add_argument("--profile", action="store_true",
                        help="print cProfile's top functions per case to stderr (implies --no-record)")
    parser.add_argument("--skip", action="append", default=[], metavar="SYSTEM",
                        help="leave out the cases of this system (its name or first word, e.g. spark); repeatable")
    parser.add_argument("--only", action="append", default=[], metavar="SYSTEM",
                        help="run only the cases of this system (its name or first word); repeatable")
    args = parser.parse_args(argv)
    unknown = [name for name in args.workloads if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(map(repr, unknown))}; valid workloads: {', '.join(WORKLOADS)}")
    if (args.messages is not None and args.messages < 1) or args.keys < 1 or args.value_bytes < 0 or args.repeat < 1:
        parser.error("--messages, --keys and --repeat must be at least 1, --value-bytes at least 0")
    if not 0 <= args.tombstones <= 1:
        parser.error("--tombstones is a share between 0 and 1")
    return args


def selected(case: Case, skip: list[str], only: list[str]) -> bool:
    def names(system: str) -> set[str]:
        return {system.lower(), system.split()[0].lower()}

    chosen = names(case.system)
    return not chosen & {name.lower() for name in skip} and (not only or bool(chosen & {n.lower() for n in only}))


def run_case(workload: Workload, case: Case, dataset: Path, repeat: int, profile: bool) -> Measurement:
    """Prepare (for read cases and jobs) and run one case, each step a fresh interpreter; the work folder is
    removed after."""
    scratch = datasets.DATA_DIR / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{workload.name}-", dir=scratch))
    try:
        base = [sys.executable, "-m", "bench._run_one"]
        where = [workload.name, case.system, "--dataset", str(dataset), "--workdir", str(workdir)]
        env = {**os.environ, **dict(case.env)}
        if case.prepared:
            subprocess.run([*base, "prepare", *where], check=True, env=env)
        out = workdir / "measurement.json"
        extra = ["--profile"] if profile else []
        subprocess.run([*base, "run", *where, "--out", str(out), "--repeat", str(repeat), *extra], check=True,
                       env=env)
        return Measurement(**json.loads(out.read_text()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """One recorded run per dataset size: --messages for every workload, or else each workload's own default."""
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])
    runs: dict[int, list[str]] = {}
    for name in args.workloads or list(WORKLOADS):
        runs.setdefault(args.messages or find(name).default_messages, []).append(name)
    for messages, names in runs.items():
        if code := run(names, messages, args, command):
            return code
    return 0


def run(names: list[str], messages: int, args: argparse.Namespace, command: str) -> int:
    """The named workloads over a dataset of ``messages`` messages: the table printed and (unless told not to)
    appended to RESULTS.md."""
    spec = ChangelogSpec(messages=messages, keys=args.keys, value_bytes=args.value_bytes,
                         distribution=args.distribution, tombstone_share=args.tombstones)
    started = time.perf_counter()
    print(f"dataset: {datasets.describe(spec)}", file=sys.stderr)
    dataset = datasets.ensure_dataset(spec)
    payload = datasets.payload_bytes(dataset)
    text = report.heading(names, f"{datasets.describe(spec)}; {payload:,} key+value bytes", command, args.repeat)
    commit_before = report.commit()
    rows: list[report.Row] = []
    for name in names:
        workload = find(name)
        results = []
        for case in workload.cases:
            if not selected(case, args.skip, args.only):
                continue
            print(f"{workload.name} / {case.system} ...", file=sys.stderr, flush=True)
            try:
                m = run_case(workload, case, dataset, args.repeat, args.profile)
            except subprocess.CalledProcessError as error:
                print(f"{workload.name} / {case.system} failed (exit {error.returncode}); see its error above.",
                      file=sys.stderr)
                return 1
            if workload.whole_dataset and m.messages != spec.messages:
                print(f"{workload.name} / {case.system} handled {m.messages:,} messages, not {spec.messages:,}",
                      file=sys.stderr)
                return 1
            results.append((case.system, case.note, m))
        rows.extend(report.make_rows(workload, results, payload))
    if report.commit() != commit_before:
        text += f"\n- the working tree changed during the run; at its end: {report.commit()}"
    text += "\n\n" + report.table(rows)
    if any(row.kept is not None for row in rows):
        text += "\n\n" + report.output_table(rows)
    print(text)
    print(f"\n(wall time {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if not (args.no_record or args.profile):
        report.record(text)
        print(f"recorded in {report.RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
