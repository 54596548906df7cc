"""Real Kafka clients against the secured endpoint (tests/security_support.py: a throwaway CA, users alice, bob and
admin, ACLs enforced): kcat over SSL with a client certificate and over SASL_SSL with PLAIN, and with SCRAM-SHA-256
(refused for Debian's kcat, whose librdkafka repeats the client nonce, as Kafka 4 refuses it);
confluent-kafka and kafka-python producing and consuming over mutual TLS as the certificate's subject, which an
ACL allows and nobody else; confluent-kafka's AdminClient creating, describing and deleting ACLs; kafka-python
refused a group by ACL; a raw SaslHandshake v0 login with a wrong password taking the failed-login path."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import GroupAuthorizationFailedError
from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from ledgerview.cli import main
from ledgerview.kafka.security_options import SecurityProtocol
from storage.security_records import acls_record
from tests.kafka_support import RawClient
from tests.security_support import CLIENT_SUBJECT, PASSWORDS, Secured, consume_values, pki, secured

__all__ = ["pki", "secured"]

logging.getLogger("kafka").setLevel(logging.CRITICAL)
CAROL = f"User:{CLIENT_SUBJECT}"
KCAT = shutil.which("kcat")


def _acl(data: Path, *arguments: str) -> None:
    assert main(["--data", str(data), "acls", "add", *arguments]) == 0


def _mutual_tls(secured: Secured) -> dict[str, object]:
    return {"bootstrap.servers": secured.bootstrap(SecurityProtocol.SSL), "security.protocol": "SSL",
            "ssl.ca.location": str(secured.pki.ca), "ssl.certificate.location": str(secured.pki.client),
            "ssl.key.location": str(secured.pki.client_key)}


def _scram(secured: Secured, user: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, object]:
    return {"bootstrap.servers": secured.bootstrap(SecurityProtocol.SASL_SSL), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secured.pki.ca), "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": PASSWORDS[user]}


def _topic_for_carol(secured: Secured, topic: str, group: str) -> None:
    """A new topic that the client certificate's subject (carol) may read and write, and a group it may use."""
    secured.store.create_topic(topic)
    _acl(secured.data, "--allow-principal", CAROL, "--operation", "Read", "--operation", "Write", "--topic", topic)
    _acl(secured.data, "--allow-principal", CAROL, "--operation", "Read", "--group", group)


@pytest.mark.slow
def test_confluent_kafka_produces_and_consumes_over_mutual_tls_as_the_certificate_subject(secured: Secured) -> None:
    _topic_for_carol(secured, "payments", "settlement")
    producer = Producer({**_mutual_tls(secured), "enable.idempotence": True})
    for i in range(20):
        producer.produce("payments", key=b"k%d" % i, value=b"p%d" % i)
    assert producer.flush(30) == 0
    assert secured.store.end_offset("payments", 0) == 20
    assert consume_values({**_mutual_tls(secured), "group.id": "settlement"}, "payments", 20) == [
        b"p%d" % i for i in range(20)]

    failures: list[KafkaError] = []
    alice = Producer({**_scram(secured, "alice"), "message.timeout.ms": 10000})
    alice.produce("payments", value=b"not carol", on_delivery=lambda error, message: failures.append(error))
    alice.flush(30)
    assert [error.code() for error in failures] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert secured.store.end_offset("payments", 0) == 20


@pytest.mark.slow
def test_kafka_python_produces_and_consumes_over_mutual_tls_as_the_certificate_subject(secured: Secured) -> None:
    _topic_for_carol(secured, "receipts", "ledger")
    tls = {"bootstrap_servers": secured.bootstrap(SecurityProtocol.SSL), "security_protocol": "SSL",
           "ssl_cafile": str(secured.pki.ca), "ssl_certfile": str(secured.pki.client),
           "ssl_keyfile": str(secured.pki.client_key)}
    producer = KafkaProducer(**tls, acks="all")
    for i in range(10):
        producer.send("receipts", key=b"r%d" % i, value=b"receipt %d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("receipts", **tls, group_id="ledger", auto_offset_reset="earliest",
                             consumer_timeout_ms=10_000)
    try:
        values = [record.value for _, record in zip(range(10), consumer, strict=False)]
    finally:
        consumer.close()
    assert values == [b"receipt %d" % i for i in range(10)]


def _admin(secured: Secured, user: str) -> AdminClient:
    return AdminClient(_scram(secured, user))


@pytest.mark.slow
def test_admin_client_creates_describes_and_deletes_acls(secured: Secured) -> None:
    admin = _admin(secured, "admin")
    binding = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.PREFIXED, "User:alice", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    group = AclBinding(ResourceType.GROUP, "billing", ResourcePatternType.LITERAL, "User:alice", "*",
                       AclOperation.READ, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding, group]).values():
        assert future.result(30) is None
    assert {(entry.principal, entry.operation, entry.resource_type, entry.resource_name, entry.pattern_type)
            for entry in acls_record(secured.data).read()} == {
        ("User:alice", "READ", "TOPIC", "orders", "PREFIXED"), ("User:alice", "READ", "GROUP", "billing", "LITERAL")}

    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    assert set(admin.describe_acls(everything).result(30)) == {binding, group}

    topics = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, "User:alice", None,
                              AclOperation.ANY, AclPermissionType.ANY)
    assert admin.delete_acls([topics])[topics].result(30) == [binding]
    assert admin.describe_acls(everything).result(30) == [group]

    alice = _admin(secured, "alice")
    refused = alice.create_acls([binding])[binding]
    with pytest.raises(KafkaException) as raised:
        refused.result(30)
    assert raised.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert len(acls_record(secured.data).read()) == 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # kafka-python's own socketpair
def test_kafka_python_is_refused_a_group_its_principal_has_no_acl_for(secured: Secured) -> None:
    secured.store.create_topic("orders")
    _acl(secured.data, "--allow-principal", "User:bob", "--operation", "Read", "--topic", "orders")
    consumer = KafkaConsumer("orders", bootstrap_servers=secured.bootstrap(SecurityProtocol.SASL_PLAINTEXT),
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                             sasl_plain_username="bob", sasl_plain_password=PASSWORDS["bob"], group_id="audit",
                             auto_offset_reset="earliest")
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            for _ in range(20):
                assert consumer.poll(timeout_ms=500) == {}
    finally:
        consumer.close()


def test_a_wrong_password_in_raw_sasl_tokens_takes_the_failed_login_path(secured: Secured,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """SaslHandshake v0: tokens are raw frames with no error response; a wrong password gets the same
    connection.failed.authentication.delay.ms before the close as SaslAuthenticate's SASL_AUTHENTICATION_FAILED."""
    client = RawClient(secured.bootstrap(SecurityProtocol.SASL_PLAINTEXT))
    try:
        assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 0).error_code == 0
        token = b"\0alice\0guess"
        with caplog.at_level(logging.INFO, logger="ledgerview.kafka.server"):
            client.send_frame(len(token).to_bytes(4, "big") + token)
            with pytest.raises(ConnectionError):
                client.read_frame()
    finally:
        client.close()
    assert any(record.getMessage().startswith("failed SASL authentication from") for record in caplog.records)
    assert "guess" not in caplog.text


def _kcat(secured: Secured, settings: dict[str, object], *arguments: str,
          stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kcat with ``settings`` in a config file (-F), never on its command line."""
    assert KCAT is not None
    config = secured.data.parent / "kcat.conf"
    config.write_text("".join(f"{key}={value}\n" for key, value in settings.items() if key != "bootstrap.servers"))
    return subprocess.run([KCAT, "-b", str(settings["bootstrap.servers"]), "-F", str(config), *arguments],
                          input=stdin, capture_output=True, text=True, timeout=120, check=False)


def _kcat_ok(secured: Secured, settings: dict[str, object], *arguments: str, stdin: str | None = None) -> str:
    done = _kcat(secured, settings, *arguments, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _kcat_librdkafka() -> tuple[int, ...]:
    assert KCAT is not None
    version = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", subprocess.run([KCAT, "-V"], capture_output=True,
                                                                          text=True, check=True).stdout)
    assert version is not None
    return tuple(int(part) for part in version.groups())


needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it with apt-get)")


@pytest.mark.slow
@needs_kcat
def test_kcat_over_ssl_with_a_client_certificate_and_over_sasl_ssl(secured: Secured) -> None:
    secured.store.create_topic("lines")
    _acl(secured.data, "--allow-principal", CAROL, "--allow-principal", "User:alice", "--operation", "Read",
         "--operation", "Write", "--topic", "lines")
    mutual, plain = _mutual_tls(secured), {**_scram(secured, "alice"), "sasl.mechanism": "PLAIN"}
    assert 'topic "lines"' in _kcat_ok(secured, mutual, "-L")
    _kcat_ok(secured, mutual, "-P", "-t", "lines", "-K", ":", stdin="a:1\nb:2\n")
    _kcat_ok(secured, plain, "-P", "-t", "lines", "-K", ":", stdin="c:3\n")
    expected = "0 a=1\n1 b=2\n2 c=3\n"
    assert _kcat_ok(secured, plain, "-C", "-t", "lines", "-e", "-o", "beginning", "-f", "%o %k=%s\n") == expected
    assert _kcat_ok(secured, mutual, "-C", "-t", "lines", "-e", "-o", "beginning", "-f", "%o %k=%s\n") == expected
    assert secured.store.end_offset("lines", 0) == 3


@pytest.mark.slow
@needs_kcat
def test_kcat_over_sasl_ssl_with_scram(secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka before 2.6.1 repeats the client nonce in its SCRAM client-final message (librdkafka #4895);
    the endpoint checks the nonce as RFC 5802 and Kafka 4 do, so such a kcat is refused, as by Kafka 4."""
    secured.store.create_topic("lines")
    _acl(secured.data, "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Write", "--topic",
         "lines")
    with caplog.at_level(logging.INFO, logger="ledgerview.kafka.server"):
        done = _kcat(secured, _scram(secured, "alice"), "-P", "-t", "lines", stdin="x\n")
    if _kcat_librdkafka() < (2, 6, 1):
        assert done.returncode != 0
        assert "the client-final nonce is not the nonce of this exchange" in caplog.text
        assert secured.store.end_offset("lines", 0) == 0
    else:
        assert done.returncode == 0, done.stderr
        assert secured.store.end_offset("lines", 0) == 1
