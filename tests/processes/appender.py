"""Append numbered messages to partition 0 of a topic until killed (or ``--max-appends`` calls are done).

Usage: python appender.py DATA_DIR TOPIC SEED [--max-appends N]

Call k appends the next ``append_sizes(SEED)`` messages, valued 0, 1, 2, ... (``plan.number_value``). After each
call returns, the number of its last message is written to stdout as one line and stdout is flushed: a line on
stdout means the store acknowledged every message up to that number. Set LEDGERVIEW_CRASH_AT to die at a crash
point (storage/faults.py).
"""

from __future__ import annotations

import argparse
import sys

import pyarrow as pa
from plan import APPENDER_MOST, append_sizes, number_value

from storage import Store


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("topic")
    parser.add_argument("seed", type=int)
    parser.add_argument("--max-appends", type=int, default=100_000)
    args = parser.parse_args()
    with Store.open(args.data_dir) as store:
        start = 0
        for _, size in zip(range(args.max_appends), append_sizes(args.seed, APPENDER_MOST), strict=False):
            values = pa.array([number_value(n) for n in range(start, start + size)], pa.binary())
            store.append(args.topic, pa.table({"value": values}), partition=0)
            start += size
            sys.stdout.write(f"{start - 1}\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
