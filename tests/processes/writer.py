"""One writer of a partition: append calls of tagged messages, started on a signal, reporting every call.

Usage: python writer.py DATA_DIR TOPIC WRITER SEED APPENDS MOST [--no-lock-wait] [--pause-after K]

Opens the store (``lock_wait`` unless --no-lock-wait) and partition 0 of TOPIC, writes "ready" and waits for a
line on stdin (a start barrier). Then makes APPENDS append calls of ``append_sizes(SEED, MOST)`` messages valued
``writer_value(WRITER, sequence)``, sequence 0, 1, 2, ... With --pause-after K it writes "paused" after K calls
and waits for another stdin line. At the end it writes one JSON line: the list of calls, each
``[first sequence, last sequence, first offset, last offset]`` with the offsets the store returned.
"""

from __future__ import annotations

import argparse
import json
import sys

import pyarrow as pa
from plan import append_sizes, writer_value

from storage import Store


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("topic")
    parser.add_argument("writer")
    parser.add_argument("seed", type=int)
    parser.add_argument("appends", type=int)
    parser.add_argument("most", type=int)
    parser.add_argument("--no-lock-wait", action="store_true")
    parser.add_argument("--pause-after", type=int, default=-1)
    args = parser.parse_args()
    calls: list[list[int]] = []
    with Store.open(args.data_dir, lock_wait=not args.no_lock_wait) as store:
        store.end_offset(args.topic, 0)
        print("ready", flush=True)
        sys.stdin.readline()
        sequence = 0
        sizes = append_sizes(args.seed, args.most)
        for call in range(args.appends):
            if call == args.pause_after:
                print("paused", flush=True)
                sys.stdin.readline()
            size = next(sizes)
            values = pa.array([writer_value(args.writer, s) for s in range(sequence, sequence + size)], pa.binary())
            result = store.append(args.topic, pa.table({"value": values}), partition=0)
            calls.append([sequence, sequence + size - 1, int(result.offsets[0]), int(result.offsets[-1])])
            sequence += size
    print(json.dumps(calls), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
