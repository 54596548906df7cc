"""The endpoint's security settings under Kafka's broker-property names: a server.properties file and the service's
[kafka] section read the same keys; an unknown key, a value not allowed, settings that cannot work together or a
non-loopback listener without TLS and authentication are refused with what is allowed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ledgerview.errors import ServiceConfigError
from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.broker_config import BrokerConfigError, endpoint_options, read_properties
from ledgerview.kafka.security_options import InsecureListenerError, SecurityConfigError, SecurityProtocol
from ledgerview.service.config import parse_service_config

SERVER_PROPERTIES = """\
# lines of a broker's server.properties
listeners=SASL_SSL://0.0.0.0:9093,PLAINTEXT://127.0.0.1:9092
ssl.keystore.type=PEM
ssl.keystore.location=/etc/kafka/server.pem
ssl.truststore.location = /etc/kafka/ca.pem
ssl.client.auth: requested
sasl.enabled.mechanisms=SCRAM-SHA-512,\\
  PLAIN
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:CN=ops,O=Example
allow.everyone.if.no.acl.found=false
max.connections=100
"""


def test_server_properties_lines_configure_the_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(SERVER_PROPERTIES)
    options = endpoint_options(read_properties(path), str(path), EndpointOptions())
    assert [(item.protocol, item.host, item.port) for item in options.bound_listeners] == [
        (SecurityProtocol.SASL_SSL, "0.0.0.0", 9093), (SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092)]
    assert options.security.sasl_enabled_mechanisms == ("SCRAM-SHA-512", "PLAIN")
    assert options.security.ssl_client_auth == "requested"
    assert options.security.super_users == ("User:admin", "User:CN=ops,O=Example")
    assert options.max_connections == 100


@pytest.mark.parametrize(("properties", "words"), [
    ({"log.dirs": "/x"}, "unknown or not supported; keys read: listeners"),
    ({"ssl.client.auth": "always"}, "is not one of required, requested, none"),
    ({"sasl.enabled.mechanisms": "GSSAPI"}, "a comma-separated list of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"listeners": "HTTP://:80"}, "PROTOCOL://host:port with PROTOCOL one of PLAINTEXT, SSL"),
    ({"ssl.keystore.type": "JKS"}, "only PEM"),
    ({"super.users": "alice"}, "expected User:NAME"),
])
def test_unknown_keys_and_values_not_allowed_are_refused(properties: dict[str, str], words: str) -> None:
    with pytest.raises(BrokerConfigError, match=words):
        endpoint_options(properties, "server.properties", EndpointOptions())


def test_settings_that_cannot_work_together_are_refused() -> None:
    with pytest.raises(SecurityConfigError, match="needs a key and certificate"):
        endpoint_options({"listeners": "SSL://127.0.0.1:9093"}, "p", EndpointOptions())
    with pytest.raises(SecurityConfigError, match="without a truststore"):
        endpoint_options({"ssl.client.auth": "required"}, "p", EndpointOptions())


def test_a_non_loopback_listener_needs_tls_and_authentication_or_insecure() -> None:
    with pytest.raises(InsecureListenerError, match="--insecure"):
        EndpointOptions(host="0.0.0.0")
    with pytest.raises(InsecureListenerError, match=re.escape("SASL_PLAINTEXT://0.0.0.0:9092")):
        endpoint_options({"listeners": "SASL_PLAINTEXT://0.0.0.0:9092"}, "p", EndpointOptions())
    assert EndpointOptions(host="0.0.0.0", insecure=True).bound_listeners[0].host == "0.0.0.0"


def test_the_service_kafka_section_takes_the_same_keys_dotted_or_quoted() -> None:
    raw = tomllib.loads("""
[kafka]
enabled = true
listeners = "SASL_PLAINTEXT://127.0.0.1:0"
sasl.enabled.mechanisms = ["PLAIN", "SCRAM-SHA-256"]
"authorizer.class.name" = "kafka.security.authorizer.AclAuthorizer"
allow.everyone.if.no.acl.found = true
""")
    options = parse_service_config(raw, "ledgerview.toml").kafka.endpoint_options()
    assert options.security.sasl_enabled_mechanisms == ("PLAIN", "SCRAM-SHA-256")
    assert options.security.allow_everyone_if_no_acl_found
    assert options.bound_listeners[0].protocol is SecurityProtocol.SASL_PLAINTEXT
    with pytest.raises(ServiceConfigError, match=r"\[kafka\].*ssl.client.auth.*required, requested, none"):
        parse_service_config(tomllib.loads('[kafka]\nssl.client.auth = "yes"\n'), "ledgerview.toml")
