"""A reader of a partition in its own process, following a writer.py that is still appending.

Usage: python reader.py DATA_DIR TOPIC WRITER SEED APPENDS MOST

Expects partition 0 of TOPIC to receive exactly what ``writer.py ... WRITER SEED APPENDS MOST`` appends into an
empty partition (so message ``n`` is ``writer_value(WRITER, n)``). Opens the store, writes "ready", then polls
``end_offset`` without pause and reads each newly visible range. Every time the end offset moves it checks that
the range reads back whole (offsets contiguous from where it was, the writer's values in order) and that the end
is the end of one of the writer's append calls (no partial batch is ever visible), then writes "seen <end>". It
writes "done" and exits 0 once it has read everything; on a violation it writes the reason to stderr and exits 1.
"""

from __future__ import annotations

import sys

from plan import first_call_ends, writer_value

from storage import Store


def main() -> int:
    data_dir, topic, writer = sys.argv[1:4]
    seed, appends, most = (int(arg) for arg in sys.argv[4:7])
    ends = first_call_ends(seed, most, appends)
    total, call_end_set = ends[-1], set(ends)
    with Store.open(data_dir) as store:
        position = store.end_offset(topic, 0)
        if position != 0:
            sys.stderr.write(f"partition not empty at start: end offset {position}\n")
            return 1
        print("ready", flush=True)
        while position < total:
            end = store.end_offset(topic, 0)
            if end == position:
                continue
            problem = None
            if end < position:
                problem = f"end offset went back from {position} to {end}"
            elif end not in call_end_set:
                problem = f"end offset {end} is inside an append call (call ends near it: " \
                          f"{sorted(e for e in call_end_set if abs(e - end) < 40)})"
            else:
                table = store.read(topic, 0, start_offset=position, end_offset=end)
                if table["offset"].to_pylist() != list(range(position, end)):
                    problem = f"offsets read from {position} to {end}: {table['offset'].to_pylist()}"
                elif table["value"].to_pylist() != [writer_value(writer, n) for n in range(position, end)]:
                    problem = f"values read from {position} to {end}: {table['value'].to_pylist()}"
            if problem is not None:
                sys.stderr.write(problem + "\n")
                return 1
            position = end
            print(f"seen {end}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
