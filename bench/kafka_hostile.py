"""Issue 18: a hostile client beside a good one. ``python -m ledgerview.kafka`` runs on 127.0.0.1 (defaults but
connections.max.idle.ms, see --idle-ms); a well-behaved confluent-kafka producer (acks=all, one message every
PACE_SECONDS) and consumer run for --seconds unloaded, then as long again while hostile clients hit the endpoint,
each bounded in count and time and stopping by itself:

- oversized fetches: FETCHES Fetch requests asking 2^31-1 bytes of a topic holding BULK_MESSAGES x 100 KB;
- compression bombs: BOMBS produce requests per codec (gzip, snappy, lz4, zstd) of 64 MiB of zeros;
- half-sent frames: HALF_SENT connections each declaring a 1 MiB request and sending half of it;
- idle connections: IDLE connections opened and left silent;
- a flood of group commits: COMMITS OffsetCommit requests, each for a new group id.

Recorded: the good producer's acknowledgement latency and the good consumer's end-to-end latency (p50, p99) in
both phases, the endpoint's idle and peak VmRSS (/proc; sampled, and VmHWM), and the configured
queued.max.request.bytes, and the endpoint's CPU time while the hostile clients ran.

Usage: python -m bench.kafka_hostile [--seconds S] [--idle-ms MS] [--only NAME ...] [--probe FILE]
Prints a markdown section for bench/RESULTS.md. With --probe the endpoint runs under bench/kafka_memory_probe.py,
which writes where its memory is to FILE every 20 ms, and the breakdown at idle and at peak RSS is printed too.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import crc32c
import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.consumer import FetchRequest, OffsetCommitRequest
from kafka.protocol.producer import ProduceRequest

from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.records import BATCH_HEADER, CRC_START, MAGIC
from ledgerview.kafka.varints import encode_varint
from storage import Store

PACE_SECONDS = 0.01
BULK_MESSAGES, FETCHES, BOMBS, BOMB_BYTES = 600, 20, 3, 64 << 20
HALF_SENT, HALF_SENT_DECLARED, IDLE, COMMITS = 200, 1 << 20, 2000, 2000
HOSTILE = ("fetches", "bombs", "half-sent", "idle", "commits")
STOP_SECONDS = 60.0
"""No hostile client runs longer than this, whatever happens."""


def _rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """``field`` of /proc/<pid>/status in bytes: VmRSS now, or VmHWM, the peak since the process started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field}")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _frame(request: object, version: int) -> bytes:
    request.with_header(correlation_id=1, client_id="hostile")  # type: ignore[attr-defined]
    return bytes(request.encode(version=version, header=True, framed=True))  # type: ignore[attr-defined]


def _bomb(codec: int) -> bytes:
    """A one-record batch whose records field is BOMB_BYTES of zeros compressed with ``codec``."""
    body = b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1) + encode_varint(BOMB_BYTES)
    pieces = [encode_varint(len(body) + BOMB_BYTES + 1) + body, *[bytes(1 << 20)] * (BOMB_BYTES >> 20), b"\x00"]
    if codec == 1:
        gzip = zlib.compressobj(9, wbits=31)
        records = b"".join(gzip.compress(piece) for piece in pieces) + gzip.flush()
    elif codec == 2:
        records = bytes(pa.Codec("snappy").compress(b"".join(pieces), asbytes=True))
    else:
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, {3: "lz4", 4: "zstd"}[codec]) as stream:
            for piece in pieces:
                stream.write(piece)
        records = sink.getvalue().to_pybytes()
    header = BATCH_HEADER.pack(0, BATCH_HEADER.size - 12 + len(records), 0, MAGIC, 0, codec, 0, 1_700_000_000_000,
                               1_700_000_000_000, -1, -1, -1, 1)
    unsigned = header + records
    batch = unsigned[:17] + struct.pack(">I", crc32c.crc32c(unsigned[CRC_START:])) + unsigned[CRC_START:]
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
    return _frame(ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=5000,
                                 topic_data=[ProduceRequest.TopicProduceData(name="bombs", partition_data=[data])]), 7)


def _ask_and_read(port: int, frames: list[bytes]) -> None:
    """Send each frame on its own connection and read its answer (or the endpoint's close)."""
    for frame in frames:
        with socket.create_connection(("127.0.0.1", port), timeout=STOP_SECONDS) as connection:
            connection.sendall(frame)
            size = connection.recv(4)
            left = struct.unpack(">i", size)[0] if len(size) == 4 else 0
            while left > 0 and (chunk := connection.recv(min(left, 1 << 20))):
                left -= len(chunk)


def oversized_fetches(port: int) -> None:
    wanted = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0, log_start_offset=-1,
                                                    partition_max_bytes=2**31 - 1)
    request = FetchRequest(version=11, replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=2**31 - 1,
                           isolation_level=0, session_id=0, session_epoch=-1,
                           topics=[FetchRequest.FetchTopic(topic="bulk", partitions=[wanted])],
                           forgotten_topics_data=[], rack_id="")
    _ask_and_read(port, [_frame(request, 11)] * FETCHES)


def compression_bombs(port: int) -> None:
    _ask_and_read(port, [_bomb(codec) for codec in (1, 2, 3, 4) for _ in range(BOMBS)])


def half_sent_frames(port: int, hold_seconds: float) -> None:
    connections = []
    for _ in range(HALF_SENT):
        connection = socket.create_connection(("127.0.0.1", port), timeout=STOP_SECONDS)
        connection.sendall(struct.pack(">i", HALF_SENT_DECLARED) + bytes(HALF_SENT_DECLARED // 2))
        connections.append(connection)
    time.sleep(hold_seconds)
    for connection in connections:
        connection.close()


def idle_connections(port: int, hold_seconds: float) -> None:
    connections = [socket.create_connection(("127.0.0.1", port), timeout=STOP_SECONDS) for _ in range(IDLE)]
    time.sleep(hold_seconds)
    for connection in connections:
        connection.close()


def commit_flood(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=STOP_SECONDS) as connection:
        for number in range(COMMITS):
            topic = OffsetCommitRequest.OffsetCommitRequestTopic
            wanted = topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=1,
                                                        committed_leader_epoch=-1, commit_timestamp=-1,
                                                        committed_metadata="")
            request = OffsetCommitRequest(version=2, group_id=f"flood-{number}", generation_id_or_member_epoch=-1,
                                          member_id="", group_instance_id=None, retention_time_ms=-1,
                                          topics=[topic(name="good", partitions=[wanted])])
            connection.sendall(_frame(request, 2))
            (size,) = struct.unpack(">i", connection.recv(4))
            while size > 0:
                size -= len(connection.recv(size))


class GoodClients:
    """The well-behaved producer and consumer: acknowledgement and end-to-end latencies in milliseconds."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                                  "enable.idempotence": True})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "good", "fetch.wait.max.ms": 50})
        self.consumer.assign([TopicPartition("good", 0, 0)])
        self.acks: list[float] = []
        self.ends: list[float] = []

    def _acknowledged(self, sent: float, error: object, message: object) -> None:
        self.acks.append((time.monotonic() - sent) * 1000)

    def run(self, seconds: float) -> tuple[list[float], list[float]]:
        acks, ends = len(self.acks), len(self.ends)
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            sent = time.monotonic()
            self.producer.produce("good", value=struct.pack(">d", time.time()),
                                  on_delivery=functools.partial(self._acknowledged, sent))
            self.producer.poll(0)
            for message in self.consumer.consume(100, timeout=PACE_SECONDS):
                value = message.value()
                if message.error() is None and value is not None:
                    self.ends.append((time.time() - struct.unpack(">d", value)[0]) * 1000)
        self.producer.flush(30)
        return self.acks[acks:], self.ends[ends:]


def _percentiles(values: list[float]) -> str:
    return f"{np.percentile(values, 50):.1f} / {np.percentile(values, 99):.1f}" if values else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_hostile", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--idle-ms", type=int, default=5000, help="the endpoint's connections.max.idle.ms")
    parser.add_argument("--only", choices=HOSTILE, action="append", help="run only these hostile clients")
    parser.add_argument("--probe", type=Path, metavar="FILE", help="sample the endpoint's memory parts into FILE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "data"
        with Store.open(data) as store:
            for topic in ("good", "bulk", "bombs"):
                store.create_topic(topic, partitions=1)
            for _ in range(BULK_MESSAGES // 100):
                store.append("bulk", [(None, np.random.bytes(100_000)) for _ in range(100)], partition=0)
        endpoint = (["-m", "ledgerview.kafka"] if args.probe is None
                    else ["-m", "bench.kafka_memory_probe", str(args.probe)])
        process = subprocess.Popen([sys.executable, *endpoint, str(data), "--port", "0",
                                    "--connections-max-idle-ms", str(args.idle_ms)], stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline().rsplit(":", 1)[1])
            good = GoodClients(f"127.0.0.1:{port}")
            good.run(2.0)  # warm-up: connections, producer id, first fetches
            idle_rss = _rss_bytes(process.pid)
            idle_at = time.monotonic()
            unloaded = good.run(args.seconds)
            peak = [idle_rss]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.05):
                    peak.append(_rss_bytes(process.pid))

            hostile: dict[str, Callable[[], None]] = {
                "fetches": lambda: oversized_fetches(port), "bombs": lambda: compression_bombs(port),
                "half-sent": lambda: half_sent_frames(port, args.seconds),
                "idle": lambda: idle_connections(port, args.seconds), "commits": lambda: commit_flood(port)}
            jobs = [sample, *(job for name, job in hostile.items() if name in (args.only or HOSTILE))]
            threads = [threading.Thread(target=job, daemon=True) for job in jobs]
            cpu = _cpu_seconds(process.pid)
            for thread in threads:
                thread.start()
            loaded = good.run(args.seconds)
            for thread in threads[1:]:
                thread.join(STOP_SECONDS)
            cpu = _cpu_seconds(process.pid) - cpu
            sampling.set()
            threads[0].join()
            high_water = _rss_bytes(process.pid, "VmHWM")
            good.consumer.close()
        finally:
            process.terminate()
            process.wait(timeout=60)
    bound = EndpointOptions().queued_max_request_bytes
    print(f"| phase | produce ack p50 / p99 ms | end-to-end p50 / p99 ms | messages |\n|---|---|---|---|\n"
          f"| unloaded | {_percentiles(unloaded[0])} | {_percentiles(unloaded[1])} | {len(unloaded[0])} |\n"
          f"| hostile load | {_percentiles(loaded[0])} | {_percentiles(loaded[1])} | {len(loaded[0])} |\n")
    print(f"endpoint VmRSS: idle {idle_rss / 2**20:.0f} MiB, peak {max(peak) / 2**20:.0f} MiB sampled every 50 ms "
          f"(VmHWM {high_water / 2**20:.0f} MiB); "
          f"queued.max.request.bytes {bound / 2**20:.0f} MiB; goal: peak under 2 x idle + bound = "
          f"{(2 * idle_rss + bound) / 2**20:.0f} MiB")
    print(f"endpoint CPU while the hostile clients ran: {cpu:.1f} s")
    if args.probe is not None:
        print(_breakdown(args.probe, idle_at))


PROBED = ("rss", "anon", "shmem", "file", "arrow", "malloc", "malloc_free", "pool", "parked", "cache")


def _breakdown(path: Path, idle_at: float) -> str:
    """The probe's samples at idle, at peak RSS and each part's own peak, in MiB."""
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    idle = min(samples, key=lambda sample: abs(sample["t"] - idle_at))
    peak = max(samples, key=lambda sample: sample["rss"])
    rows = [("idle", idle), ("at peak RSS", peak), ("each part's peak", {name: max(sample[name] for sample in samples)
                                                                       for name in PROBED})]
    head = "| sample | " + " | ".join(PROBED) + " |\n|---|" + "---|" * len(PROBED) + "\n"
    return head + "\n".join(f"| {label} | " + " | ".join(f"{row[name] / 2**20:.0f}" for name in PROBED) + " |"
                             for label, row in rows)


if __name__ == "__main__":
    main()
