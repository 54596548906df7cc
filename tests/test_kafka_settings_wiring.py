"""The endpoint's newer settings (queued.max.request.bytes, offsets.retention.minutes,
offsets.retention.check.interval.ms, frame.stall.timeout.ms) are broker properties, keys of the service's [kafka]
section and options of ``python -m ledgerview.kafka``, like the older limits; and compressed produced batches are
decoded off the event loop."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from ledgerview.errors import ServiceConfigError
from ledgerview.kafka import EndpointOptions, KafkaEndpoint, produce
from ledgerview.kafka.broker_config import BrokerConfigError, endpoint_options
from ledgerview.kafka.records import decode_batches
from ledgerview.service.config import parse_service_config
from storage import Store


def test_broker_properties_set_the_new_settings() -> None:
    options = endpoint_options({"queued.max.request.bytes": "-1", "offsets.retention.minutes": "60",
                                "offsets.retention.check.interval.ms": "1000", "frame.stall.timeout.ms": "500"},
                               "server.properties", EndpointOptions())
    assert (options.queued_max_request_bytes, options.offsets_retention_minutes,
            options.offsets_retention_check_interval_ms, options.frame_stall_timeout_ms) == (-1, 60, 1000, 500)
    with pytest.raises(BrokerConfigError, match=r"queued.max.request.bytes: 0 is below 1 and not -1 \(no bound\)"):
        endpoint_options({"queued.max.request.bytes": "0"}, "server.properties", EndpointOptions())


def test_the_service_kafka_section_takes_them_as_plain_or_dotted_keys() -> None:
    kafka: dict[str, Any] = {"queued_max_request_bytes": 4096, "offsets": {"retention": {"minutes": 5}},
                             "frame.stall.timeout.ms": 700}
    options = parse_service_config({"kafka": kafka}, "s.toml").kafka.endpoint_options()
    assert (options.queued_max_request_bytes, options.offsets_retention_minutes, options.frame_stall_timeout_ms) == (
        4096, 5, 700)
    with pytest.raises(ServiceConfigError, match=r"\[kafka\] frame_stall_timeout_ms: 0 is below 1"):
        parse_service_config({"kafka": {"frame_stall_timeout_ms": 0}}, "s.toml")


@pytest.mark.slow  # a Python process or more of its own: after the fast suite
def test_the_endpoint_process_takes_them_as_options(tmp_path: Path) -> None:
    refused = subprocess.run([sys.executable, "-m", "ledgerview.kafka", str(tmp_path), "--port", "0",
                              "--offsets-retention-minutes", "0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "offsets_retention_minutes is 0; it must be at least 1" in refused.stderr


@pytest.mark.slow
def test_compressed_batches_are_decoded_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return decode_batches(*args, **kwargs)

    monkeypatch.setattr(produce, "decode_batches", recording)
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
    with KafkaEndpoint(data, port=0) as endpoint:
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{endpoint.port}", compression_type="gzip")
        producer.send("t", value=b"x" * 1000).get(timeout=60)
        producer.close()
    assert threads and all(name.startswith("kafka-heavy-work") for name in threads)
