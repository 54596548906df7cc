"""Compact a generated changelog with a given budget and print the peak growth of anonymous memory (bytes).

Usage: compact_memory.py DATA_DIR BUDGET_BYTES MESSAGES KEYS
Anonymous memory (RssAnon) is sampled every millisecond while compaction runs; file pages of the memory-mapped
segments are not counted, as the kernel can drop them at will.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from compactor import Compactor
from ledgerview.changelog import ChangelogSpec, generate
from storage import Store


def anonymous_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> None:
    folder, budget, messages, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with Store.open(folder) as store:
        store.create_topic("t", config={"compaction.memory.bytes": budget})
        data = generate(ChangelogSpec(messages=messages, keys=keys, value_bytes=20, tombstone_share=0.01))
        for start in range(0, messages, 50_000):
            store.append("t", data.slice(start, 50_000), partition=0)
        del data
        store.flush()
        baseline = anonymous_bytes()
        peak = baseline
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, anonymous_bytes())
                time.sleep(0.001)

        sampler = threading.Thread(target=sample)
        sampler.start()
        [result] = Compactor(store).compact("t")
        done.set()
        sampler.join()
        print(peak - baseline, result.passes, result.messages_kept)


if __name__ == "__main__":
    main()
