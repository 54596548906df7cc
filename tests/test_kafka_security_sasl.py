"""SASL on the Kafka endpoint with real clients: confluent-kafka over SASL_SSL and kafka-python over SASL_PLAINTEXT
and SASL_SSL, with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, produce and consume as their user once it has the ACLs;
a wrong password or an unknown user is refused and reads nothing; nothing but ApiVersions and SaslHandshake is
served before authentication; a mechanism not enabled is UNSUPPORTED_SASL_MECHANISM."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaTimeoutError
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from ledgerview.cli import main
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.security_options import SecurityProtocol
from tests.kafka_support import RawClient, wait_for
from tests.security_support import PASSWORDS, Secured, consume_values, pki, secured

__all__ = ["pki", "secured"]

logging.getLogger("kafka").setLevel(logging.CRITICAL)
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _grant(data: Path, user: str, topic: str, group: str) -> None:
    for arguments in (["--operation", "Read", "--operation", "Write", "--topic", topic], ["--operation", "Read",
                                                                                           "--group", group]):
        assert main(["--data", str(data), "acls", "add", "--allow-principal", f"User:{user}", *arguments]) == 0


def _confluent(secured: Secured, mechanism: str, user: str, password: str) -> dict[str, object]:
    return {"bootstrap.servers": secured.bootstrap(SecurityProtocol.SASL_SSL), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secured.pki.ca), "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password}


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_produces_and_consumes_over_sasl_ssl(secured: Secured, mechanism: str) -> None:
    secured.store.create_topic("orders")
    _grant(secured.data, "alice", "orders", "billing")
    config = _confluent(secured, mechanism, "alice", PASSWORDS["alice"])
    producer = Producer({**config, "enable.idempotence": True})
    for i in range(10):
        producer.produce("orders", key=b"k%d" % i, value=b"v%d" % i)
    assert producer.flush(30) == 0
    assert secured.store.end_offset("orders", 0) == 10
    assert consume_values({**config, "group.id": "billing"}, "orders", 10) == [b"v%d" % i for i in range(10)]


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("protocol", [SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL])
def test_kafka_python_produces_and_consumes_over_sasl(secured: Secured, mechanism: str,
                                                      protocol: SecurityProtocol) -> None:
    secured.store.create_topic("orders")
    _grant(secured.data, "bob", "orders", "audit")
    config: dict[str, object] = {"bootstrap_servers": secured.bootstrap(protocol),
                                 "security_protocol": protocol.value, "sasl_mechanism": mechanism,
                                 "sasl_plain_username": "bob", "sasl_plain_password": PASSWORDS["bob"]}
    if protocol.tls:
        config["ssl_cafile"] = str(secured.pki.ca)
    producer = KafkaProducer(**config)
    for i in range(5):
        producer.send("orders", key=b"k", value=b"v%d" % i)
    producer.flush(timeout=30)
    producer.close()
    consumer = KafkaConsumer("orders", group_id="audit", auto_offset_reset="earliest", consumer_timeout_ms=10000,
                             fetch_max_wait_ms=100, **config)
    try:
        values = [record.value for _, record in zip(range(5), consumer, strict=False)]
    finally:
        consumer.close()
    assert values == [b"v%d" % i for i in range(5)]


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "alice-secret")])
def test_confluent_kafka_with_a_wrong_password_is_refused_and_reads_nothing(secured: Secured, mechanism: str,
                                                                           user: str, password: str) -> None:
    secured.store.create_topic("orders")
    errors: list[KafkaError] = []
    consumer = Consumer({**_confluent(secured, mechanism, user, password), "group.id": "g",
                         "auto.offset.reset": "earliest", "error_cb": errors.append})
    consumer.subscribe(["orders"])
    try:
        def refused() -> bool:
            message = consumer.poll(0.2)
            assert message is None or message.error() is not None
            return any(error.code() == KafkaError._AUTHENTICATION for error in errors)
        wait_for(refused, "confluent-kafka to report an authentication failure")
    finally:
        consumer.close()
    assert any("Authentication failed" in error.str() for error in errors)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # kafka-python's own socketpair
def test_kafka_python_with_a_wrong_password_is_refused(secured: Secured) -> None:
    """kafka-python retries a refused login until its bootstrap timeout, then gives up: it never gets in."""
    secured.store.create_topic("orders")
    _grant(secured.data, "alice", "orders", "billing")
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=secured.bootstrap(SecurityProtocol.SASL_PLAINTEXT),
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                      sasl_plain_password="wrong", bootstrap_timeout_ms=3000)
    gc.collect()  # the producer it could not build leaves its socketpair to the collector: collect it here
    assert secured.store.end_offset("orders", 0) == 0


def _raw(secured: Secured) -> RawClient:
    return RawClient(secured.bootstrap(SecurityProtocol.SASL_PLAINTEXT))


def test_nothing_but_api_versions_and_handshake_is_served_before_authentication(secured: Secured) -> None:
    client = _raw(secured)
    try:
        versions = client.request(ApiVersionsRequest(), ApiVersionsResponse, 0)
        assert {17, 36} <= {entry.api_key for entry in versions.api_keys}
        with pytest.raises(ConnectionError):
            client.request(MetadataRequest(topics=None), MetadataResponse, 1)
    finally:
        client.close()


def test_a_mechanism_not_enabled_is_refused_with_the_enabled_list(secured: Secured) -> None:
    client = _raw(secured)
    try:
        response = client.request(SaslHandshakeRequest(mechanism="GSSAPI"), SaslHandshakeResponse, 1)
        assert response.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert list(response.mechanisms) == list(MECHANISMS)
    finally:
        client.close()


def test_plain_over_sasl_authenticate_then_requests_are_served(secured: Secured) -> None:
    client = _raw(secured)
    try:
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
        wrong = _raw(secured)
        assert wrong.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
        refused = wrong.request(SaslAuthenticateRequest(auth_bytes=b"\0alice\0guess"), SaslAuthenticateResponse, 1)
        assert refused.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "guess" not in (refused.error_message or "")
        with pytest.raises(ConnectionError):
            wrong.read_frame()
        wrong.close()
        accepted = client.request(SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"),
                                  SaslAuthenticateResponse, 1)
        assert accepted.error_code == 0
        metadata = client.request(MetadataRequest(topics=None), MetadataResponse, 1)
        assert metadata.topics == []
    finally:
        client.close()
