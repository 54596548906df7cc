"""What clients are told to connect to: Kafka's advertised.listeners (server.properties, the service's [kafka]
section, ``python -m ledgerview.kafka --advertised-listeners``), checked as Kafka checks it, and, when nothing is
advertised, a listener that binds every interface advertised as this machine's canonical host name, as Kafka does,
never as 0.0.0.0, which a client on another machine cannot connect to."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ledgerview.errors import ServiceConfigError
from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.advertised import AdvertisedListenersError
from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.broker_config import endpoint_options
from ledgerview.service.config import parse_service_config
from storage import Store

WILDCARD = EndpointOptions(host="0.0.0.0", insecure=True)


def test_advertised_listeners_are_checked_as_kafka_checks_them() -> None:
    with pytest.raises(AdvertisedListenersError, match="subset of those of listeners: PLAINTEXT"):
        endpoint_options({"advertised.listeners": "SSL://broker:9093"}, "p", WILDCARD)
    with pytest.raises(AdvertisedListenersError, match=re.escape("cannot use the nonroutable meta-address 0.0.0.0")):
        endpoint_options({"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}, "p", WILDCARD)
    with pytest.raises(AdvertisedListenersError, match="PLAINTEXT is advertised more than once"):
        endpoint_options({"advertised.listeners": "PLAINTEXT://a:9092,PLAINTEXT://b:9092"}, "p", WILDCARD)
    with pytest.raises(AdvertisedListenersError, match="not an address a client can connect to"):
        EndpointOptions(advertised_host="0.0.0.0")
    # the worked example of docs/security.md
    options = endpoint_options({"listeners": "SASL_SSL://0.0.0.0:9093,SSL://0.0.0.0:9094,PLAINTEXT://127.0.0.1:9092",
                                "advertised.listeners": "SASL_SSL://broker:9093,SSL://broker:9094",
                                "ssl.keystore.location": "server.pem", "ssl.truststore.location": "ca.pem",
                                "ssl.client.auth": "required"}, "p", EndpointOptions())
    assert [str(item) for item in options.advertised_listeners] == ["SASL_SSL://broker:9093", "SSL://broker:9094"]


def test_the_service_kafka_section_takes_advertised_listeners_or_advertised_host_not_both() -> None:
    section = '[kafka]\nenabled = true\nhost = "0.0.0.0"\ninsecure = true\n'
    config = parse_service_config(tomllib.loads(section + 'advertised.listeners = "PLAINTEXT://broker:9092"\n'), "c")
    assert [str(item) for item in config.kafka.endpoint_options().advertised_listeners] == ["PLAINTEXT://broker:9092"]
    with pytest.raises(ServiceConfigError, match="given with advertised_host 'broker'"):
        parse_service_config(tomllib.loads(section + 'advertised_host = "broker"\n'
                                           'advertised.listeners = "PLAINTEXT://broker:9092"\n'), "c")


def _broker_address(bootstrap: str) -> tuple[str, int]:
    brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).brokers
    [broker] = brokers.values()
    return broker.host, broker.port


@pytest.mark.slow
def test_a_listener_on_every_interface_is_advertised_as_the_canonical_host_name(tmp_path: Path) -> None:
    with KafkaEndpoint(tmp_path / "data", options=EndpointOptions(host="0.0.0.0", port=0, insecure=True)) as endpoint:
        assert _broker_address(f"127.0.0.1:{endpoint.port}") == (socket.getfqdn(), endpoint.port)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_the_standalone_endpoint_advertises_its_advertised_listener_and_clients_use_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("t")
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "ledgerview.kafka", str(data), "--host", "0.0.0.0",
                                "--port", str(port), "--insecure", "--advertised-listeners",
                                f"PLAINTEXT://127.0.0.2:{port}"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("listening on 0.0.0.0:")
        bootstrap = f"127.0.0.1:{port}"
        assert _broker_address(bootstrap) == ("127.0.0.2", port)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce("t", b"through the advertised address")
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
        try:
            consumer.assign([TopicPartition("t", 0, 0)])
            deadline, message = time.monotonic() + 60, None
            while message is None and time.monotonic() < deadline:
                message = consumer.poll(0.5)
            assert message is not None and message.error() is None
            assert message.value() == b"through the advertised address"
        finally:
            consumer.close()
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()
