"""How the endpoint secures its listeners: the listeners themselves (Kafka's ``listeners``), TLS, SASL and the
authorizer, as frozen options checked together in ``check_security`` (the cross-key rules live there only).
Their broker-property names and parsing are in ledgerview/kafka/broker_config.py."""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

from storage.errors import LedgerviewError


class SecurityProtocol(enum.Enum):
    """Kafka's listener security protocols."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True)
class Listener:
    """One address the endpoint listens on, and how clients there must connect."""

    protocol: SecurityProtocol
    host: str
    """Address to bind; empty binds every interface, as in Kafka's ``PLAINTEXT://:9092``."""
    port: int
    """0 picks a free port (KafkaEndpoint.ports tells which)."""

    def __str__(self) -> str:
        return f"{self.protocol.value}://{self.host}:{self.port}"


AUTHORIZERS = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer")
"""The ``authorizer.class.name`` values that turn ACL enforcement on (both mean the data folder's ACLs)."""
CLIENT_AUTH = ("required", "requested", "none")
TLS_PROTOCOLS = ("TLSv1.2", "TLSv1.3")


@dataclass(frozen=True)
class SecurityOptions:
    """TLS, SASL and ACL settings shared by every listener, under their Kafka broker-property names."""

    ssl_keystore_location: str = ""
    """PEM file with the private key and the certificate chain."""
    ssl_keystore_certificate_chain: str = field(default="", repr=False)
    """The certificate chain itself, in PEM (instead of ssl_keystore_location)."""
    ssl_keystore_key: str = field(default="", repr=False)
    """The private key itself, in PEM (with ssl_keystore_certificate_chain)."""
    ssl_key_password: str = field(default="", repr=False)
    """Password of an encrypted private key."""
    ssl_truststore_location: str = ""
    """PEM file of the CA certificates client certificates must chain to."""
    ssl_truststore_certificates: str = field(default="", repr=False)
    """The CA certificates themselves, in PEM (instead of ssl_truststore_location)."""
    ssl_client_auth: str = "none"
    """SSL listeners: ``required`` (a client without a trusted certificate is refused), ``requested`` or ``none``."""
    ssl_enabled_protocols: tuple[str, ...] = TLS_PROTOCOLS
    sasl_enabled_mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    sasl_server_max_receive_size: int = 524288
    """Kafka's sasl.server.max.receive.size: the largest frame accepted before authentication completes."""
    connection_failed_authentication_delay_ms: int = 100
    """Kafka's connection.failed.authentication.delay.ms: how long a failed login waits before its answer and the
    close, which slows password guessing."""
    authorizer_class_name: str = ""
    """Empty: no ACLs are enforced (Kafka without an authorizer). One of AUTHORIZERS: the data folder's ACLs are."""
    super_users: tuple[str, ...] = ()
    """Principals (``User:alice``) allowed everything, whatever the ACLs say."""
    allow_everyone_if_no_acl_found: bool = False
    """With an authorizer: a resource no ACL matches is open to everyone (Kafka's meaning)."""

    @property
    def keystore_given(self) -> bool:
        return bool(self.ssl_keystore_location or self.ssl_keystore_certificate_chain)

    @property
    def truststore_given(self) -> bool:
        return bool(self.ssl_truststore_location or self.ssl_truststore_certificates)


class InsecureListenerError(LedgerviewError):
    """A listener reachable from other machines without TLS and authentication."""

    def __init__(self, listener: Listener) -> None:
        super().__init__(
            f"Refusing to listen on {listener}: it is not a loopback address, and clients there would connect "
            "without TLS and authentication (anyone on the network could read, write and delete every topic). Use "
            "SASL_SSL, or SSL with ssl.client.auth=required, or say --insecure (insecure = true in the service's "
            "[kafka] section) to accept the risk.")


class SecurityConfigError(LedgerviewError):
    """Security settings that cannot work together, or a value not allowed for its key."""

    def __init__(self, key: str, problem: str, allowed: str) -> None:
        self.key = key
        super().__init__(f"Security config {key}: {problem}. {allowed}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_security(listeners: tuple[Listener, ...], security: SecurityOptions, *, insecure: bool) -> None:
    """The rules between keys; raises SecurityConfigError or InsecureListenerError."""
    if any(listener.protocol.tls for listener in listeners) and not security.keystore_given:
        raise SecurityConfigError("ssl.keystore.location", "an SSL or SASL_SSL listener needs a key and certificate",
                                  "Set ssl.keystore.location (a PEM file with both), or ssl.keystore.certificate.chain "
                                  "and ssl.keystore.key.")
    if security.ssl_keystore_location and security.ssl_keystore_certificate_chain:
        raise SecurityConfigError("ssl.keystore.certificate.chain", "given with ssl.keystore.location",
                                  "Give one of the two.")
    if bool(security.ssl_keystore_certificate_chain) != bool(security.ssl_keystore_key):
        raise SecurityConfigError("ssl.keystore.key", "ssl.keystore.certificate.chain and ssl.keystore.key go "
                                  "together", "Give both, or ssl.keystore.location instead.")
    if security.ssl_client_auth != "none" and not security.truststore_given:
        raise SecurityConfigError("ssl.client.auth", f"{security.ssl_client_auth} without a truststore",
                                  "Set ssl.truststore.location to the PEM file of the CAs client certificates "
                                  "chain to.")
    if any(listener.protocol.sasl for listener in listeners) and not security.sasl_enabled_mechanisms:
        raise SecurityConfigError("sasl.enabled.mechanisms", "empty with a SASL listener",
                                  "Enable PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.")
    ports = [(listener.host, listener.port) for listener in listeners if listener.port]
    if len(set(ports)) != len(ports):
        raise SecurityConfigError("listeners", "two listeners share a host and port", "Give each its own port.")
    for listener in listeners:
        secured = listener.protocol is SecurityProtocol.SASL_SSL or (
            listener.protocol is SecurityProtocol.SSL and security.ssl_client_auth == "required")
        if not (insecure or secured or is_loopback(listener.host)):
            raise InsecureListenerError(listener)
