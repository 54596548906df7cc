"""``python -m bench.kafka_memory_probe OUT.jsonl DATA [endpoint options]``: ``python -m ledgerview.kafka`` with a
thread that writes, every PROBE_SECONDS, one JSON line of where the process's memory is (bench/kafka_hostile.py
--probe starts the endpoint this way and summarises the lines):

- ``rss``, ``anon``, ``shmem``, ``file``: /proc/self/smaps_rollup's Rss, Anonymous, shared anonymous pages
  (Pss_Shmem: mmap.mmap(-1, n) is MAP_SHARED) and the file-backed rest (mapped segment pages, shared libraries);
- ``arrow``: bytes Arrow's allocator hands out now (pa.total_allocated_bytes());
- ``malloc``: bytes glibc malloc hands out now (mallinfo2 uordblks + hblkhd: Python's large objects, encoded
  batches, request frames), ``malloc_free``: bytes glibc keeps free in its heaps;
- ``pool``, ``parked``: queued.max.request.bytes counted and parked (request_queue.py);
- ``cache``: the fetch cache's bytes (batch_cache.py).
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from ledgerview.kafka import __main__ as endpoint_main
from ledgerview.kafka import server
from ledgerview.kafka.broker import Broker

PROBE_SECONDS = 0.02


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _smaps() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return fields


def main() -> None:
    out_path, argv = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    endpoints: list[server.KafkaEndpoint] = []
    brokers: list[Broker] = []
    original_init, original_post = server.KafkaEndpoint.__init__, Broker.__post_init__

    def init(self: server.KafkaEndpoint, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        endpoints.append(self)

    def post(self: Broker) -> None:
        original_post(self)
        brokers.append(self)

    server.KafkaEndpoint.__init__ = init  # type: ignore[method-assign]
    Broker.__post_init__ = post  # type: ignore[method-assign]

    def probe() -> None:
        with open(out_path, "w") as out:
            while True:
                smaps, info = _smaps(), libc.mallinfo2()
                queued = endpoints[0]._queued if endpoints else None
                line = {"t": time.monotonic(), "rss": smaps["Rss"], "anon": smaps["Anonymous"],
                        "shmem": smaps["Pss_Shmem"], "file": smaps["Rss"] - smaps["Anonymous"] - smaps["Pss_Shmem"],
                        "arrow": pa.total_allocated_bytes(),
                        "malloc": info.uordblks + info.hblkhd, "malloc_free": info.fordblks,
                        "pool": queued.queued_bytes if queued else 0, "parked": queued.parked_bytes if queued else 0,
                        "cache": brokers[0].fetch_cache.size_bytes if brokers else 0}
                out.write(json.dumps(line) + "\n")
                out.flush()
                time.sleep(PROBE_SECONDS)

    threading.Thread(target=probe, daemon=True, name="memory-probe").start()
    endpoint_main.main(argv)


if __name__ == "__main__":
    main()
