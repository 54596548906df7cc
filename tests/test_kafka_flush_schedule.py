"""The endpoint's log flusher (Kafka's, log.flush.scheduler.interval.ms): a partition that goes quiet after a
produce is fsynced, and its recovery point moved past what was produced, once its topic's flush.ms has passed,
without another produce. DESIGN.md's durability invariant: what lies below the recovery point was fsynced."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaProducer

from ledgerview.kafka import EndpointOptions, KafkaEndpoint
from ledgerview.kafka.broker_config import BrokerConfigError, endpoint_options
from ledgerview.service.config import parse_service_config
from storage import Store
from storage.checkpoints import read_checkpoint
from tests.kafka_support import wait_for

FLUSH_MESSAGES = 5
"""The first produce reaches flush.messages, so its append flushes and flush.ms counts from there."""
FLUSH_CHECK_MS = 100
"""log.flush.scheduler.interval.ms here (off by default, as in Kafka)."""
FLUSH_MS = 500
"""Far longer than one produce's round trip, so the second produce's append is not itself past flush.ms."""


def recovery_point(data: Path, topic: str) -> int:
    return read_checkpoint(data / "recovery-point-offset-checkpoint").get((topic, 0), 0)


def _produce(producer: KafkaProducer, topic: str, count: int) -> list[int]:
    futures = [producer.send(topic, value=b"v%d" % number) for number in range(count)]
    producer.flush(timeout=60)
    return [future.get(timeout=60).offset for future in futures]


def test_a_partition_that_goes_quiet_is_flushed_once_flush_ms_has_passed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("quiet", partitions=1, config={"flush.ms": str(FLUSH_MS),
                                                          "flush.messages": str(FLUSH_MESSAGES)})
    options = EndpointOptions(port=0, log_flush_scheduler_interval_ms=FLUSH_CHECK_MS)
    with KafkaEndpoint(data, options=options) as endpoint:
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{endpoint.port}", acks="all", linger_ms=1000,
                                 request_timeout_ms=60000)
        try:
            assert _produce(producer, "quiet", FLUSH_MESSAGES) == list(range(FLUSH_MESSAGES))
            assert recovery_point(data, "quiet") == FLUSH_MESSAGES  # flush.messages: flushed by the append itself
            assert _produce(producer, "quiet", 1) == [FLUSH_MESSAGES]  # one more, far below flush.messages
            # Nothing is produced any more: only the flusher can flush the last message.
            wait_for(lambda: recovery_point(data, "quiet") > FLUSH_MESSAGES,
                     "the quiet partition's recovery point to pass the last message", timeout_seconds=15)
        finally:
            producer.close()


def test_the_interval_is_a_broker_property() -> None:
    assert EndpointOptions().log_flush_scheduler_interval_ms == 2**63 - 1  # Kafka's default: in effect never
    options = endpoint_options({"log.flush.scheduler.interval.ms": "250"}, "server.properties", EndpointOptions())
    assert options.log_flush_scheduler_interval_ms == 250
    section = parse_service_config({"kafka": {"log.flush.scheduler.interval.ms": 300}}, "s.toml").kafka
    assert section.endpoint_options().log_flush_scheduler_interval_ms == 300
    section = parse_service_config({"kafka": {"log_flush_scheduler_interval_ms": 400}}, "s.toml").kafka
    assert section.endpoint_options().log_flush_scheduler_interval_ms == 400
    with pytest.raises(BrokerConfigError, match=r"log.flush.scheduler.interval.ms: 0 is below 1"):
        endpoint_options({"log.flush.scheduler.interval.ms": "0"}, "server.properties", EndpointOptions())
    with pytest.raises(ValueError, match=r"log_flush_scheduler_interval_ms is 0; it must be at least 1"):
        EndpointOptions(log_flush_scheduler_interval_ms=0)


def test_kafkas_default_interval_is_taken_and_the_endpoint_serves(tmp_path: Path) -> None:
    """Kafka's default, Long.MAX_VALUE milliseconds, written out: a flusher that in effect never runs, beside a
    working endpoint."""
    options = endpoint_options({"log.flush.scheduler.interval.ms": str(2**63 - 1)}, "server.properties",
                               EndpointOptions(port=0))
    with Store.open(tmp_path / "data") as store:
        store.create_topic("served", partitions=1)
    with KafkaEndpoint(tmp_path / "data", options=options) as endpoint:
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{endpoint.port}", request_timeout_ms=60000)
        try:
            assert _produce(producer, "served", 1) == [0]
        finally:
            producer.close()
