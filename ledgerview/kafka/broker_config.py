"""The endpoint's settings under Kafka's broker-property names, defined once: name, parser, what is allowed and a
line of doc per key (Kafka's ConfigDef). A broker's server.properties lines that apply can be reused as they are
(``python -m ledgerview.kafka DATA --config server.properties``), and the service's [kafka] section takes the same
keys (ledgerview/service/config.py). An unknown key or a value not allowed is a BrokerConfigError naming the key,
the value and what is allowed; nothing starts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerview.kafka.broker import GROUP_SETTINGS, SETTINGS, UNBOUNDED_AT_MINUS_ONE, EndpointOptions
from ledgerview.kafka.sasl_mechanisms import MECHANISMS
from ledgerview.kafka.security_options import (
    AUTHORIZERS,
    CLIENT_AUTH,
    TLS_PROTOCOLS,
    Listener,
    SecurityOptions,
    SecurityProtocol,
)
from storage.errors import LedgerviewError

_PROPERTY = re.compile(r"([^=:\s]+)\s*[=:\s]\s*(.*)$")
_LISTENER = re.compile(r"(?P<protocol>[A-Z_]+)://(?P<host>\[[0-9a-fA-F:]+\]|[^:/\[\]]*):(?P<port>\d+)")


class BrokerConfigError(LedgerviewError):
    """A broker property that is unknown or has a value that is not allowed."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"{source}: {key}: {problem}.")


@dataclass(frozen=True)
class ConfigKey:
    name: str
    parse: Callable[[str], Any]
    """The value from its text; raises ValueError saying what is allowed."""
    doc: str


def _listeners(text: str) -> tuple[Listener, ...]:
    listeners = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _LISTENER.fullmatch(item)
        protocols = ", ".join(protocol.value for protocol in SecurityProtocol)
        if match is None or match["protocol"] not in SecurityProtocol.__members__:
            raise ValueError(f"{item!r} is not PROTOCOL://host:port with PROTOCOL one of {protocols}")
        port = int(match["port"])
        if port > 65535:
            raise ValueError(f"{item!r}: port {port} is above 65535")
        listeners.append(Listener(SecurityProtocol[match["protocol"]], match["host"].strip("[]"), port))
    if not listeners:
        raise ValueError("no listener; expected e.g. SASL_SSL://0.0.0.0:9093,PLAINTEXT://127.0.0.1:9092")
    return tuple(listeners)


def _advertised_listeners(text: str) -> tuple[Listener, ...]:
    """Kafka's advertised.listeners, in the form of listeners; empty: none (every listener advertised as itself)."""
    return _listeners(text) if text.strip() else ()


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def _choices(choices: tuple[str, ...], *, allow_empty: bool = False) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        wrong = [item for item in items if item not in choices]
        if wrong or not (items or allow_empty):
            raise ValueError(f"{text!r}: a comma-separated list of {', '.join(choices)}")
        return items
    return parse


def _int_at_least(minimum: int, *, or_minus_one: bool = False) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
        if value < minimum and not (or_minus_one and value == -1):
            raise ValueError(f"{value} is below {minimum}" + (" and not -1 (no bound)" if or_minus_one else ""))
        return value
    return parse


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(f"{text!r} is not true or false")
    return text.lower() == "true"


def _principals(text: str) -> tuple[str, ...]:
    principals = tuple(part.strip() for part in text.split(";") if part.strip())
    for principal in principals:
        if not principal.startswith("User:") or principal == "User:":
            raise ValueError(f"{principal!r} is not a principal; expected User:NAME, several separated by ';'")
    return principals


def _pem_only(text: str) -> str:
    if text != "PEM":
        raise ValueError(f"{text!r}: only PEM key and trust stores are read (convert JKS or PKCS12 with openssl)")
    return text


def _text(text: str) -> str:
    return text


_SECURITY_KEYS = (
    ConfigKey("ssl.keystore.location", _text, "PEM file holding the private key and its certificate chain"),
    ConfigKey("ssl.keystore.certificate.chain", _text, "the certificate chain itself, in PEM"),
    ConfigKey("ssl.keystore.key", _text, "the private key itself, in PEM"),
    ConfigKey("ssl.key.password", _text, "password of an encrypted private key"),
    ConfigKey("ssl.truststore.location", _text, "PEM file of the CAs client certificates must chain to"),
    ConfigKey("ssl.truststore.certificates", _text, "those CA certificates themselves, in PEM"),
    ConfigKey("ssl.client.auth", _choice(CLIENT_AUTH), "SSL listeners: client certificates required, requested "
              "or none"),
    ConfigKey("ssl.enabled.protocols", _choices(TLS_PROTOCOLS), "TLS versions accepted"),
    ConfigKey("sasl.enabled.mechanisms", _choices(MECHANISMS), "SASL mechanisms offered on SASL listeners"),
    ConfigKey("sasl.server.max.receive.size", _int_at_least(1), "largest frame read before authentication"),
    ConfigKey("connection.failed.authentication.delay.ms", _int_at_least(0), "delay before a failed login's "
              "answer and close"),
    ConfigKey("authorizer.class.name", _choice(("", *AUTHORIZERS)), "enforce the data folder's ACLs (empty: no "
              "ACLs are enforced)"),
    ConfigKey("super.users", _principals, "principals allowed everything, separated by ';'"),
    ConfigKey("allow.everyone.if.no.acl.found", _boolean, "a resource no ACL matches is open to everyone"),
)
_ENDPOINT_KEYS = (
    ConfigKey("listeners", _listeners, "PROTOCOL://host:port, comma-separated (PLAINTEXT, SSL, SASL_PLAINTEXT, "
              "SASL_SSL)"),
    ConfigKey("advertised.listeners", _advertised_listeners, "PROTOCOL://host:port, comma-separated: the address "
              "clients are told to connect to for the listener of that protocol (not 0.0.0.0)"),
    *(ConfigKey(name.replace("_", "."), _int_at_least(1, or_minus_one=name in UNBOUNDED_AT_MINUS_ONE),
                f"EndpointOptions.{name} (docs/kafka.md)") for name in SETTINGS),
    *(ConfigKey(name.replace("_", "."), _int_at_least(1), f"EndpointOptions.{name} (docs/kafka.md)")
      for name in GROUP_SETTINGS),
)
_STORE_TYPES = (ConfigKey("ssl.keystore.type", _pem_only, "PEM only"),
                ConfigKey("ssl.truststore.type", _pem_only, "PEM only"))
CONFIG_KEYS: dict[str, ConfigKey] = {key.name: key for key in (*_ENDPOINT_KEYS, *_SECURITY_KEYS, *_STORE_TYPES)}
"""Every broker property the endpoint reads."""


def _value_text(value: object) -> str:
    """A TOML value as the text a properties file would hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def parse_broker_properties(properties: Mapping[str, object], source: str) -> dict[str, Any]:
    """Each key's parsed value; raises BrokerConfigError for an unknown key or a value not allowed."""
    parsed = {}
    for key, value in properties.items():
        definition = CONFIG_KEYS.get(key)
        if definition is None:
            raise BrokerConfigError(source, key, f"unknown or not supported; keys read: {', '.join(CONFIG_KEYS)}")
        try:
            parsed[key] = definition.parse(_value_text(value))
        except ValueError as error:
            raise BrokerConfigError(source, key, f"{error} ({definition.doc})") from None
    return parsed


TLS_KEYS = tuple(name for name in CONFIG_KEYS if name.startswith("ssl."))
"""The keys of TLS alone (key store, trust store, client certificates, versions): what the HTTP server takes."""


def security_options(properties: Mapping[str, object], source: str, allowed: tuple[str, ...]) -> SecurityOptions:
    """SecurityOptions from ``properties``, which may hold only the security keys named in ``allowed``; raises
    BrokerConfigError for any other key or a value not allowed."""
    for key in properties:
        if key not in allowed:
            raise BrokerConfigError(source, key, f"unknown or not supported here; keys read: {', '.join(allowed)}")
    parsed = parse_broker_properties(properties, source)
    return SecurityOptions(**{key.replace(".", "_"): value for key, value in parsed.items()
                              if key in {item.name for item in _SECURITY_KEYS}})


def endpoint_options(properties: Mapping[str, object], source: str, base: EndpointOptions) -> EndpointOptions:
    """``base`` with the given broker properties applied; raises BrokerConfigError or a security check's error."""
    parsed = parse_broker_properties(properties, source)
    security = {key.replace(".", "_"): value for key, value in parsed.items()
                if key in {item.name for item in _SECURITY_KEYS}}
    endpoint = {key.replace(".", "_"): value for key, value in parsed.items()
                if key in {item.name for item in _ENDPOINT_KEYS}}
    return dataclasses.replace(base, security=dataclasses.replace(base.security, **security), **endpoint)


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file's keys and values: ``key=value``, ``key: value`` or ``key value``; ``#`` and ``!``
    comments; a backslash at a line's end continues the value on the next line."""
    properties: dict[str, str] = {}
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        if not line or line[0] in "#!":
            continue
        match = _PROPERTY.match(line)
        key, value = (match[1], match[2]) if match else (line, "")
        properties[key] = value.replace("\\n", "\n")
    return properties
