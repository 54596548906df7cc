"""The service config: a TOML file (stdlib tomllib) read into frozen dataclasses, every key checked.

Each section is a dataclass whose fields are its keys, with their defaults; an unknown key, a missing required
one or a value of the wrong type is refused with the section, the key and what is allowed, before anything
starts. conf/ledgerview.toml is the documented default.
"""

from __future__ import annotations

import dataclasses
import ssl
import threading
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from ledgerview.errors import ServiceConfigError
from ledgerview.kafka.broker import SETTINGS, EndpointOptions
from ledgerview.kafka.broker_config import CONFIG_KEYS, TLS_KEYS, endpoint_options, security_options
from ledgerview.kafka.security_options import SecurityConfigError, SecurityOptions, check_security
from ledgerview.kafka.tls import server_context
from ledgerview.service.http import MAX_CONNECTIONS
from ledgerview.service.http_access import HttpAccess, check_http_security
from storage.errors import InvalidTopicNameError, LedgerviewError
from storage.files import validate_topic_name
from storage.object_store import WRITABLE_SCHEMES

SourceKind = Literal["generator", "directory", "topic", "kafka"]


@dataclass(frozen=True)
class StoreSection:
    data: str = "data"
    """The data folder; a relative path is taken from the working directory."""


@dataclass(frozen=True)
class ServiceSection:
    flush_interval_s: float = 1.0
    """How often appended data is fsynced, recovery points move and source checkpoints are written."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"


HTTP_PROPERTIES = (*TLS_KEYS, "super.users", "connection.failed.authentication.delay.ms")
"""The Kafka broker properties [http] takes (docs/security.md)."""


@dataclass(frozen=True)
class HttpSection:
    """The HTTP status server; TLS and who may read it under Kafka's property names (docs/security.md)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9464
    """0 picks a free port; the chosen one is in the service.started log line."""
    tokens_file: str = ""
    """Bearer tokens: lines of ``<sha256 hex of the token> <principal>``; empty: none."""
    insecure: bool = False
    """Allow a non-loopback host without TLS and authentication."""
    max_connections: int = MAX_CONNECTIONS
    """Kafka's max.connections, for the HTTP server: connections beyond it are closed as they arrive (each open one
    holds a thread until it ends or its request_timeout passes)."""
    max_connections_per_ip: int = MAX_CONNECTIONS
    """Kafka's max.connections.per.ip: the same, for connections from one client address."""
    broker_properties: dict[str, Any] = field(default_factory=dict)
    """Every dotted key of the section: ``ssl.*`` (TLS, client certificates), ``super.users`` and
    ``connection.failed.authentication.delay.ms``."""

    def security(self) -> SecurityOptions:
        """TLS settings, super users and the failed-authentication delay; raises BrokerConfigError,
        SecurityConfigError or InsecureHttpError."""
        security = security_options(self.broker_properties, "[http]", HTTP_PROPERTIES)
        check_security((), security, insecure=True)
        if security.ssl_client_auth != "none" and not security.keystore_given:
            raise SecurityConfigError("ssl.client.auth", f"{security.ssl_client_auth} without TLS",
                                      "Client certificates need ssl.keystore.location too.")
        check_http_security(self.host, security, tokens=bool(self.tokens_file), insecure=self.insecure)
        return security

    def tls_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None for plain HTTP; raises TlsSetupError when the stores cannot load."""
        security = self.security()
        return server_context(security, security.ssl_client_auth) if security.keystore_given else None

    def access(self, data: Path) -> HttpAccess:
        """Who may read which route; raises TokenFileError."""
        return HttpAccess.of(data, self.security(), self.tokens_file)


@dataclass(frozen=True)
class LoopSection:
    enabled: bool = True
    interval_s: float = 30.0


@dataclass(frozen=True)
class RemoteSection:
    """The store's remote tier (storage/remote_tier.py) and the loop that uploads sealed segments of topics with
    ``remote.storage.enable=true`` (Kafka's remote log manager copy task)."""

    uri: str = ""
    """``s3://bucket/prefix`` or ``file:///mount/prefix``; the store is opened with it and the data folder remembers
    it. Empty: the tier the data folder remembers, if any (else the store has none)."""
    enabled: bool = True
    """Run the upload loop (when the store has a remote tier)."""
    interval_s: float = 30.0


@dataclass(frozen=True)
class TopicSection:
    """A topic the service creates at start when it is missing (an existing one is left as it is)."""

    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceSection:
    """One ingest source; ``type`` chooses which keys apply (the others keep their defaults)."""

    name: str
    type: SourceKind
    topic: str
    batch_messages: int = 1000
    """Messages per append (generator; a directory source appends its files 8 MiB of whole lines at a time)."""
    interval_s: float = 1.0
    """Pause between appends when the source has nothing more right now (generator: between every append)."""
    # generator
    keys: int = 1000
    value_bytes: int = 16
    tombstone_every: int = 0
    """Every n-th generated message is a tombstone; 0: none."""
    limit: int = 0
    """Stop generating after this many messages; 0: never."""
    # directory
    path: str = ""
    """The folder whose files are read in name order; files must be complete when they appear (write them under a
    hidden name, ``.name``, or one the pattern does not match, and rename)."""
    pattern: str = "*"
    format: Literal["text", "json"] = "text"
    separator: str = "\t"
    null_marker: str | None = None
    # topic (a Spark streaming query from another ledgerview topic of the same store) and kafka (a Spark
    # streaming query mirroring a topic of any Kafka cluster, partition for partition)
    source_topic: str = ""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    """Where a new query starts reading ``source_topic``; a restarted one continues from its checkpoint."""
    bootstrap_servers: str = ""
    """kafka: the cluster's ``host:port`` list, comma-separated."""


@dataclass(frozen=True)
class SparkSection:
    """With ``enabled``, directory and topic sources run as Spark Structured Streaming queries into the
    ``ledgerview`` sink (exactly once per micro-batch through Spark's checkpoints); the generator stays direct."""

    enabled: bool = False
    master: str = "local[2]"


@dataclass(frozen=True)
class KafkaSection:
    """The Kafka-protocol endpoint: Kafka clients produce to and consume from the store's topics, and read each
    topic's compacted view under ``<topic><compacted_suffix>`` (docs/kafka.md)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9092
    """0 picks a free port; the chosen one is in the service.started log line."""
    compacted_suffix: str = ".compacted"
    advertised_host: str = ""
    """The host clients are told to connect to, for every listener (with the port it bound); empty: each
    listener's host, or this machine's canonical host name for one on every interface; not with the broker
    property advertised.listeners (ledgerview/kafka/advertised.py)."""
    fetch_cache_bytes: int = EndpointOptions.fetch_cache_bytes
    socket_request_max_bytes: int = EndpointOptions.socket_request_max_bytes
    """Kafka's socket.request.max.bytes: a larger request closes its connection unread."""
    fetch_max_bytes: int = EndpointOptions.fetch_max_bytes
    """Kafka's fetch.max.bytes: the most one Fetch response carries, whatever the client asks."""
    connections_max_idle_ms: int = EndpointOptions.connections_max_idle_ms
    """Kafka's connections.max.idle.ms: an idle connection, a frame incomplete this long or responses unread this
    long close the connection."""
    max_connections: int = EndpointOptions.max_connections
    """Kafka's max.connections: connections beyond it are closed as they arrive."""
    max_connections_per_ip: int = EndpointOptions.max_connections_per_ip
    """Kafka's max.connections.per.ip: connections from one address beyond it are closed as they arrive."""
    queued_max_request_bytes: int = EndpointOptions.queued_max_request_bytes
    """Kafka's queued.max.request.bytes: the most bytes of requests read and not answered, across connections (-1:
    no bound)."""
    offsets_retention_minutes: int = EndpointOptions.offsets_retention_minutes
    """Kafka's offsets.retention.minutes: committed offsets of an empty group older than this are removed."""
    offsets_retention_check_interval_ms: int = EndpointOptions.offsets_retention_check_interval_ms
    """Kafka's offsets.retention.check.interval.ms."""
    frame_stall_timeout_ms: int = EndpointOptions.frame_stall_timeout_ms
    """A request frame whose bytes stop arriving this long closes its connection (ledgerview's own)."""
    log_flush_scheduler_interval_ms: int = EndpointOptions.log_flush_scheduler_interval_ms
    """Kafka's log.flush.scheduler.interval.ms: how often partitions past their flush.ms are flushed."""
    insecure: bool = False
    """Allow a listener on a non-loopback address without TLS and authentication (docs/security.md)."""
    broker_properties: dict[str, Any] = field(default_factory=dict)
    """Every dotted key of the section (``listeners``, ``ssl.*``, ``sasl.*``, ``authorizer.class.name``,
    ``super.users``, ...): Kafka broker properties, as in server.properties (ledgerview/kafka/broker_config.py)."""

    def endpoint_options(self) -> EndpointOptions:
        """The endpoint's options; raises BrokerConfigError, SecurityConfigError or InsecureListenerError."""
        base = EndpointOptions(host=self.host, port=self.port, compacted_suffix=self.compacted_suffix,
                               advertised_host=self.advertised_host or None, fetch_cache_bytes=self.fetch_cache_bytes,
                               insecure=self.insecure, **{name: getattr(self, name) for name in SETTINGS})
        return endpoint_options(self.broker_properties, "[kafka]", base)


@dataclass(frozen=True)
class ServiceConfig:
    path: str
    store: StoreSection = StoreSection()
    service: ServiceSection = ServiceSection()
    http: HttpSection = HttpSection()
    compaction: LoopSection = LoopSection(interval_s=30.0)
    retention: LoopSection = LoopSection(interval_s=300.0)
    cleaner: LoopSection = LoopSection(interval_s=15.0)
    topics: tuple[TopicSection, ...] = ()
    sources: tuple[SourceSection, ...] = ()
    spark: SparkSection = SparkSection()
    kafka: KafkaSection = KafkaSection()
    remote: RemoteSection = RemoteSection()

    @property
    def data(self) -> Path:
        return Path(self.store.data)


_SECTIONS: dict[str, type[Any]] = {"store": StoreSection, "service": ServiceSection, "http": HttpSection,
                                   "compaction": LoopSection, "retention": LoopSection, "cleaner": LoopSection,
                                   "spark": SparkSection, "kafka": KafkaSection, "remote": RemoteSection}


def read_service_config(path: Path) -> ServiceConfig:
    """Read and check the config file; raises ServiceConfigError naming what is wrong."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ServiceConfigError(str(path), "file", "not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ServiceConfigError(str(path), "TOML", str(error)) from None
    return parse_service_config(raw, str(path))


def parse_service_config(raw: dict[str, Any], path: str) -> ServiceConfig:
    known = {*_SECTIONS, "topics", "sources"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ServiceConfigError(path, f"section [{unknown[0]}]", f"unknown; sections: {', '.join(sorted(known))}")
    sections: dict[str, Any] = {}
    for name, kind in _SECTIONS.items():
        if name in raw:
            defaults = dataclasses.asdict(getattr(ServiceConfig, name))
            table = _table(raw[name], path, f"[{name}]")
            if kind in (KafkaSection, HttpSection):
                table = _with_broker_properties(table, kind)
            sections[name] = _build(kind, {**defaults, **table}, path, f"[{name}]")
    data = Path(sections.get("store", StoreSection()).data)
    checks: dict[str, Callable[[Any], object]] = {"kafka": lambda kafka: kafka.endpoint_options(),
                                                  "http": lambda http: http.access(data)}
    for name, check in checks.items():
        try:
            if name in sections:
                check(sections[name])
        except (LedgerviewError, ValueError) as error:
            raise ServiceConfigError(path, f"[{name}]", str(error).rstrip(".")) from None
    sections["topics"] = tuple(_build(TopicSection, _table(item, path, f"[[topics]] #{i + 1}"), path,
                                      f"[[topics]] #{i + 1}") for i, item in enumerate(_list(raw, "topics", path)))
    sources = tuple(_build(SourceSection, _table(item, path, f"[[sources]] #{i + 1}"), path, f"[[sources]] #{i + 1}")
                    for i, item in enumerate(_list(raw, "sources", path)))
    for number, topic in enumerate(sections["topics"], 1):
        _check_topic_name(topic.name, path, f"[[topics]] #{number} name")
    _check_sources(sources, path, spark_enabled=sections.get("spark", SparkSection()).enabled)
    _check_remote(sections.get("remote", RemoteSection()), path)
    sections["sources"] = sources
    return ServiceConfig(path, **sections)


def _with_broker_properties(table: dict[str, Any], kind: type[Any]) -> dict[str, Any]:
    """The [kafka] or [http] table with its Kafka broker properties gathered under ``broker_properties``: TOML
    reads ``ssl.client.auth = "required"`` as nested tables, and a quoted ``"ssl.client.auth"`` as one key; both
    are the property ``ssl.client.auth``. A key that is not a field of ``kind`` is a property when it is dotted or
    one the endpoint reads (``listeners``); any other is left for _build to refuse as unknown."""
    fields = {item.name for item in dataclasses.fields(kind)} - {"broker_properties"}
    plain = {key: value for key, value in table.items() if key in fields}
    properties: dict[str, Any] = {}

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}", inner)
        else:
            properties[prefix] = value

    for key, value in table.items():
        if key in fields:
            continue
        if isinstance(value, dict) or "." in key or key in CONFIG_KEYS:
            flatten(key, value)
        else:
            plain[key] = value
    return {**plain, "broker_properties": properties}


def _check_remote(remote: RemoteSection, path: str) -> None:
    """A URI of a remote tier the service can write to, checked by its form only (no request is made)."""
    if not remote.uri:
        return
    try:
        parsed = urlparse(remote.uri)
    except ValueError as error:
        raise ServiceConfigError(path, "[remote] uri", f"{remote.uri!r}: {error}") from None
    if parsed.scheme not in WRITABLE_SCHEMES:
        problem = "is not an s3:// or file:// URI, the remote tiers ledgerview writes to"
    elif parsed.scheme == "s3" and not parsed.netloc:
        problem = "names no bucket (s3://bucket/prefix)"
    elif parsed.scheme == "file" and (parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")):
        problem = "is not an absolute local path (file:///mount/prefix: three slashes)"
    else:
        return
    raise ServiceConfigError(path, "[remote] uri", f"{remote.uri!r} {problem}")


def _check_sources(sources: tuple[SourceSection, ...], path: str, *, spark_enabled: bool) -> None:
    names = [source.name for source in sources]
    for source in sources:
        where = f"[[sources]] {source.name!r}"
        _check_source_name(source.name, path, f"{where} name")
        _check_topic_name(source.topic, path, f"{where} topic")
        if names.count(source.name) > 1:
            raise ServiceConfigError(path, where, "two sources have this name; each needs its own")
        if source.type == "directory" and not source.path:
            raise ServiceConfigError(path, where, "a directory source needs path = the folder to read")
        if source.type == "topic" and not (spark_enabled and source.source_topic):
            raise ServiceConfigError(path, where, "a topic source runs on Spark: it needs [spark] enabled = true "
                                     "and source_topic = the topic to read")
        if source.type == "kafka" and not (spark_enabled and source.source_topic and source.bootstrap_servers):
            raise ServiceConfigError(path, where, "a kafka source runs on Spark: it needs [spark] enabled = true, "
                                     "bootstrap_servers = the cluster and source_topic = the Kafka topic to mirror")
        for key in ("batch_messages", "keys", "value_bytes"):
            if getattr(source, key) < 1:
                raise ServiceConfigError(path, f"{where} {key}", "must be >= 1")
        for key, zero in (("limit", "never stops"), ("tombstone_every", "no tombstones")):
            if getattr(source, key) < 0:
                raise ServiceConfigError(path, f"{where} {key}", f"must be >= 0 (0: {zero})")


def _check_topic_name(name: str, path: str, where: str) -> None:
    try:
        validate_topic_name(name)
    except InvalidTopicNameError as error:
        raise ServiceConfigError(path, where, str(error).rstrip(".")) from None


def _check_source_name(name: str, path: str, where: str) -> None:
    """A source's name names its checkpoint file (and Spark checkpoint folder) in the data folder and its header:
    the rule of topic names, so that no name leaves the folder."""
    try:
        validate_topic_name(name)
    except InvalidTopicNameError as error:
        raise ServiceConfigError(path, where, "it names the source's checkpoint file, so it follows the rule of "
                                 f"topic names: {str(error).rstrip('.')}") from None


def _list(raw: dict[str, Any], name: str, path: str) -> list[Any]:
    items = raw.get(name, [])
    if not isinstance(items, list):
        raise ServiceConfigError(path, name, f"must be an array of tables ([[{name}]])")
    return items


def _table(value: Any, path: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ServiceConfigError(path, where, "must be a table")
    return value


def _build(kind: type[Any], values: dict[str, Any], path: str, where: str) -> Any:
    fields = {item.name: item for item in dataclasses.fields(kind)}
    hints = typing.get_type_hints(kind)
    for key, value in values.items():
        if key not in fields:
            keys = ", ".join(name for name in fields if name != "broker_properties")
            raise ServiceConfigError(path, f"{where} {key}", f"unknown key; keys: {keys}")
        if not _matches(value, hints[key]):
            raise ServiceConfigError(path, f"{where} {key}", f"{value!r} is not {_describe(hints[key])}")
    missing = [name for name, item in fields.items() if name not in values
               and item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING]
    if missing:
        raise ServiceConfigError(path, where, f"missing required key {missing[0]!r}")
    for key, value in values.items():
        _check_range(key, value, path, f"{where} {key}")
    return kind(**values)


def _check_range(key: str, value: Any, path: str, where: str) -> None:
    """Ranges read off the key's name (units last): seconds above 0 (an interval of 0 would spin a loop) and at most
    threading.TIMEOUT_MAX (a longer wait fails the thread; nan and inf are refused), a port in 0 to 65535, counts
    of messages, partitions and connections, byte limits (``_max_bytes``) and milliseconds at least 1."""
    if key.endswith("_s") and not 0 < value <= threading.TIMEOUT_MAX:
        raise ServiceConfigError(path, where, f"{value!r} is not above 0 seconds and at most "
                                 f"{threading.TIMEOUT_MAX:.0f} (the longest a thread waits)")
    if key == "port" and not 0 <= value <= 65535:
        raise ServiceConfigError(path, where, f"{value!r} is not a port (0 to 65535; 0 picks a free one)")
    counted = ("_messages", "partitions", "_max_bytes", "_ms", "max_connections", "max_connections_per_ip")
    if key.endswith(counted) and isinstance(value, int) and value < 1:
        raise ServiceConfigError(path, where, f"{value!r} is below 1")


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_matches(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is dict or hint is dict:
        return isinstance(value, dict) and all(isinstance(key, str) for key in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    if origin is dict:
        return "a table"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            type(None): "absent"}.get(hint, str(hint))
