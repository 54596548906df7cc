"""A reader that looks at a partition once: its end offset and how many messages read back.

Usage: python peek.py DATA_DIR TOPIC

Writes "<end offset> <messages read>" on one line, then closes the store and exits 0.
"""

from __future__ import annotations

import sys

from storage import Store


def main() -> int:
    data_dir, topic = sys.argv[1:3]
    with Store.open(data_dir) as store:
        print(store.end_offset(topic, 0), store.read(topic, 0).num_rows, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
