"""Issue 21: what TLS and SASL cost the Kafka endpoint's throughput. confluent-kafka produces N messages (acks=all,
bench/kafka.py's producer settings) to a fresh 1-partition topic and then consumes them from offset 0, through
``python -m ledgerview.kafka`` on 127.0.0.1 with one listener of each kind in turn: PLAINTEXT, SSL (server
certificate only) and SASL_SSL with SCRAM-SHA-256. One run each; the endpoint and the client share the machine.

The certificate is a throwaway self-signed one for 127.0.0.1 made with openssl; the SCRAM user is added with
``ledgerview users add``. Starting the endpoint and building the messages are untimed; the timed part of a
consume includes the client's connection (and so its TLS handshake and SASL exchange), as does a produce.

Usage: python -m bench.kafka_security [--messages N] [--value-bytes B]
Prints a markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.kafka import (
    confluent_chunks,
    confluent_consume_all,
    confluent_produce_all,
    endpoint,
)
from bench.measurement import cpu_seconds
from bench.report import heading
from bench.systems import TOPIC
from ledgerview.cli import main as ledgerview
from storage import Store

USER, PASSWORD = "bench", "bench-password-not-secret"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


def _certificate(folder: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 with its key, in one PEM file (the keystore and the clients' CA)."""
    keystore = folder / "server.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(keystore), "-out", str(folder / "cert.pem")], check=True, capture_output=True)
    keystore.write_text(keystore.read_text() + (folder / "cert.pem").read_text())
    return folder / "cert.pem"


def _settings(protocol: str, folder: Path) -> tuple[str, dict[str, str]]:
    """The endpoint's properties file and the client's security settings for ``protocol``."""
    properties = [f"listeners={protocol}://127.0.0.1:0"]
    client: dict[str, str] = {"security.protocol": protocol}
    if protocol != "PLAINTEXT":
        properties += [f"ssl.keystore.location={folder / 'server.pem'}"]
        client["ssl.ca.location"] = str(folder / "cert.pem")
    if protocol == "SASL_SSL":
        properties += ["sasl.enabled.mechanisms=SCRAM-SHA-256"]
        client |= {"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": USER, "sasl.password": PASSWORD}
    config = folder / f"{protocol}.properties"
    config.write_text("\n".join(properties) + "\n")
    return str(config), client


def _timed(pid: int, run: Callable[[], int]) -> tuple[float, float]:
    """(seconds, endpoint CPU seconds) of ``run``."""
    cpu, start = cpu_seconds(pid), time.perf_counter()
    run()
    return time.perf_counter() - start, cpu_seconds(pid) - cpu


def measure(protocol: str, folder: Path, chunks: list[list[dict[str, bytes | None]]]) -> list[str]:
    """One table row each for produce and consume over ``protocol``, in a fresh data folder."""
    data = folder / f"data-{protocol}"
    with Store.open(data) as store:
        store.create_topic(TOPIC, partitions=1)
    password = folder / "password"
    password.write_text(PASSWORD + "\n")
    assert ledgerview(["--data", str(data), "users", "add", USER, "--password-file", str(password)]) == 0
    config, client = _settings(protocol, folder)
    messages = sum(len(chunk) for chunk in chunks)
    rows = []
    with endpoint(data, "--config", config) as (bootstrap, pid):
        for name, run in (("produce", lambda: confluent_produce_all(bootstrap, chunks, client)),
                          ("consume", lambda: confluent_consume_all(bootstrap, messages, client))):
            seconds, endpoint_cpu = _timed(pid, run)
            rows.append(f"| {protocol} | {name} | {seconds:.2f} | {messages / seconds / 1e3:.0f} k | "
                        f"{messages * len(chunks[0][0]['value'] or b'') / seconds / 1e6:.1f} | "
                        f"{endpoint_cpu / messages * 1e6:.1f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_security", description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    chunks = confluent_chunks([(b"k%09d" % i, os.urandom(args.value_bytes)) for i in range(args.messages)])
    dataset = f"{args.messages:,} messages, 10-byte keys, {args.value_bytes}-byte random values, 1 partition"
    command = f"python -m bench.kafka_security --messages {args.messages} --value-bytes {args.value_bytes}"
    title, _, *lines = heading(["TLS and SASL"], dataset, command, 1).split("\n")
    with tempfile.TemporaryDirectory(prefix="bench-kafka-security-") as scratch:
        folder = Path(scratch)
        _certificate(folder)
        rows = [row for protocol in PROTOCOLS for row in measure(protocol, folder, chunks)]
    run = title.removeprefix("## ").rsplit(": ", 1)[0]
    header = "| listener | client | seconds | messages/s | MB/s of values | endpoint CPU us/message |"
    print("\n".join([f"- run: {run}", *lines, "", header, "|---|---|---|---|---|---|", *rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
