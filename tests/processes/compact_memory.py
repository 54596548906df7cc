"""Compact a generated changelog with a given budget and print the peak growth of anonymous memory (bytes).

Usage: compact_memory.py DATA_DIR BUDGET_BYTES MESSAGES KEYS [chosen]
With ``chosen`` the keys are 8-byte words chosen so that the word times the fixed multiplier phase one's buckets
used before (2**64 / phi) has all its top bits zero: a hostile producer's keys against that release.
Anonymous memory (RssAnon) is sampled every millisecond while compaction runs; file pages of the memory-mapped
segments are not counted, as the kernel can drop them at will.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from compactor import Compactor
from ledgerview.changelog import ChangelogSpec, generate
from storage import Store


def anonymous_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


FORMER_BUCKET_MULTIPLIER = 0x9E3779B97F4A7C15


def keys_in_one_former_bucket(messages: int, keys: int) -> pa.Array:
    """``messages`` keys over ``keys`` distinct 8-byte words w with w * FORMER_BUCKET_MULTIPLIER < 2**48 (mod 2**64)."""
    ids = np.random.default_rng(7).integers(0, keys, messages).astype(np.uint64)
    words = ids * np.uint64(pow(FORMER_BUCKET_MULTIPLIER, -1, 2**64))  # wraps mod 2**64
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), messages, [None, pa.py_buffer(
        words.astype(">u8").tobytes())]).cast(pa.binary())


def main() -> None:
    folder, budget, messages, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with Store.open(folder) as store:
        store.create_topic("t", config={"compaction.memory.bytes": budget})
        data = generate(ChangelogSpec(messages=messages, keys=keys, value_bytes=20, tombstone_share=0.01))
        if sys.argv[5:] == ["chosen"]:
            data = data.set_column(0, "key", keys_in_one_former_bucket(messages, keys))
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
