"""Real certificates for the security tests, made with ``cryptography`` (a throwaway CA, a server certificate for
127.0.0.1, client certificates, an expired one and one from another CA), and an endpoint with every kind of
listener over a data folder holding users and ACLs."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ledgerview.kafka import KafkaEndpoint
from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.broker_config import endpoint_options
from ledgerview.kafka.scram import HASHES, new_credential
from ledgerview.kafka.security_options import SecurityProtocol
from storage import Store
from storage.security_records import credentials_record
from tests.kafka_support import RawClient, wait_for

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
CLIENT_SUBJECT = "CN=carol,OU=payments,O=Example Corp,C=GB"
"""Kafka's spelling (RFC 2253) of the client certificate's subject."""


@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def _name(common_name: str, unit: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COUNTRY_NAME, "GB"), x509.NameAttribute(NameOID.ORGANIZATION_NAME,
                                                                               "Example Corp")]
    if unit:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    return x509.Name([*parts, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_authority(name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    return Authority(key, certificate)


def issue(authority: Authority, folder: Path, stem: str, subject: x509.Name, *, server: bool = False,
          expired: bool = False) -> tuple[Path, Path]:
    """A certificate (and its key) signed by ``authority``, written as PEM; returns (certificate, key) paths, the
    certificate file holding the key too (a keystore for ssl.keystore.location)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - datetime.timedelta(days=10), now - datetime.timedelta(days=5)) if expired else (
        now - datetime.timedelta(days=1), now + datetime.timedelta(days=1))
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(authority.certificate.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(
            "127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    certificate = builder.sign(authority.key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    certificate_pem = certificate.public_bytes(serialization.Encoding.PEM)
    key_path, certificate_path = folder / f"{stem}.key", folder / f"{stem}.pem"
    key_path.write_bytes(key_pem)
    certificate_path.write_bytes(certificate_pem + key_pem)
    return certificate_path, key_path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server: Path
    client: Path
    client_key: Path
    expired: Path
    expired_key: Path
    stranger: Path
    stranger_key: Path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    authority, other = new_authority("test-ca"), new_authority("other-ca")
    ca = folder / "ca.pem"
    ca.write_bytes(authority.certificate.public_bytes(serialization.Encoding.PEM))
    server, _ = issue(authority, folder, "server", _name("localhost"), server=True)
    client, client_key = issue(authority, folder, "client", _name("carol", "payments"))
    expired, expired_key = issue(authority, folder, "expired", _name("mallory"), expired=True)
    stranger, stranger_key = issue(other, folder, "stranger", _name("carol", "payments"))
    return Pki(ca, server, client, client_key, expired, expired_key, stranger, stranger_key)


@dataclass
class Secured:
    endpoint: KafkaEndpoint
    data: Path
    store: Store
    pki: Pki

    def bootstrap(self, protocol: SecurityProtocol) -> str:
        return f"127.0.0.1:{self.endpoint.port_of(protocol)}"

    def tls_client(self, protocol: SecurityProtocol = SecurityProtocol.SSL, *, certificate: Path | None = None,
                   key: Path | None = None) -> RawClient:
        """A raw protocol client over TLS to the listener of ``protocol``, presenting ``certificate``."""
        client = RawClient(self.bootstrap(protocol))
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        if certificate is not None:
            context.load_cert_chain(str(certificate), str(key))
        client.socket = context.wrap_socket(client.socket, server_hostname="127.0.0.1")
        return client


def security_properties(pki: Pki, **overrides: str) -> dict[str, str]:
    """Broker properties with all four kinds of listener on free loopback ports and ACLs enforced."""
    return {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
                         "SASL_SSL://127.0.0.1:0",
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.server),
            "ssl.truststore.location": str(pki.ca), "ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin", "connection.failed.authentication.delay.ms": "10", **overrides}


def add_users(data: Path) -> None:
    record = credentials_record(data)
    for user, password in PASSWORDS.items():
        credentials = {mechanism: new_credential(mechanism, password) for mechanism in HASHES}
        record.update(lambda current, user=user, credentials=credentials: {**current, user: credentials})


def start_secured(data: Path, pki: Pki, **overrides: str) -> KafkaEndpoint:
    options = endpoint_options(security_properties(pki, **overrides), "test", EndpointOptions())
    return KafkaEndpoint(data, options=options).start()


@pytest.fixture
def secured(tmp_path: Path, pki: Pki) -> Iterator[Secured]:
    """An endpoint with PLAINTEXT, SSL (client certificates required), SASL_PLAINTEXT and SASL_SSL listeners,
    users alice, bob and admin (a super user), ACLs enforced and none granted yet."""
    data = tmp_path / "data"
    with Store.open(data) as store:
        add_users(data)
        endpoint = start_secured(data, pki)
        try:
            yield Secured(endpoint, data, store, pki)
        finally:
            endpoint.stop()


def tls_handshake_fails(port: int, pki: Pki, certificate: Path | None, key: Path | None) -> bool:
    """Whether a TLS connection presenting ``certificate`` is refused (in the handshake, or at the first read:
    in TLS 1.3 the server checks the client certificate after the client's handshake ends)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if certificate is not None:
        context.load_cert_chain(str(certificate), str(key))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
            connection.sendall(b"\0\0\0\x0a\0\x12\0\0\0\0\0\x01\0\0")
            return connection.recv(4) == b""
    except (ssl.SSLError, ConnectionError):
        return True


def consume_values(config: dict[str, object], topic: str, count: int) -> list[bytes]:
    """The first ``count`` values a confluent-kafka consumer with ``config`` reads from ``topic``, from the start."""
    consumer = Consumer({**config, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        def read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            return len(values) >= count
        wait_for(read, f"{count} messages of {topic}")
    finally:
        consumer.close()
    return values
