"""What every request handler of the endpoint shares: its options, the store, and the signal that wakes
long-polling fetches."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from dataclasses import dataclass, field

from ledgerview.kafka.advertised import advertised_address, check_advertised
from ledgerview.kafka.authorizer import Authorizer, Operation, ResourceType, Session
from ledgerview.kafka.batch_cache import EncodedBatchCache
from ledgerview.kafka.coordinator import GroupCoordinator
from ledgerview.kafka.heavy_work import HeavyWork
from ledgerview.kafka.read_ahead import KeptReads
from ledgerview.kafka.security_options import Listener, SecurityOptions, SecurityProtocol, check_security
from ledgerview.kafka.sequences import ProducerSequences
from ledgerview.kafka.topics import resolve_topic
from storage import Store
from storage.errors import LedgerviewError

NODE_ID = 0
CLUSTER_ID = "ledgerview"
LIMITS = ("socket_request_max_bytes", "fetch_max_bytes", "connections_max_idle_ms", "max_connections",
          "max_connections_per_ip")
"""EndpointOptions' bounds on what one client may ask, named as Kafka's broker configs with dots made underscores;
each at least 1."""
SETTINGS = (*LIMITS, "queued_max_request_bytes", "offsets_retention_minutes", "offsets_retention_check_interval_ms",
            "frame_stall_timeout_ms", "log_flush_scheduler_interval_ms")
"""The integer settings of EndpointOptions but the group coordinator's (GROUP_SETTINGS), named as their broker
properties (Kafka's, but frame.stall.timeout.ms) with dots made underscores; each at least 1, or -1 (no bound) for
those in UNBOUNDED_AT_MINUS_ONE."""
UNBOUNDED_AT_MINUS_ONE = ("queued_max_request_bytes",)
GROUP_SETTINGS = ("group_min_session_timeout_ms", "group_max_session_timeout_ms", "group_max_size")
"""The group coordinator's integer settings of EndpointOptions, named as Kafka's broker properties with dots made
underscores, each at least 1: broker properties (a --config file, dotted keys of the service's [kafka] section), not
command-line options."""


@dataclass(frozen=True)
class EndpointOptions:
    """How the endpoint listens, secures its listeners and names views."""

    host: str = "127.0.0.1"
    """Address to listen on (one PLAINTEXT listener) when ``listeners`` is empty; loopback by default."""
    port: int = 9092
    """TCP port of that listener; 0 picks a free one (see KafkaEndpoint.port)."""
    listeners: tuple[Listener, ...] = ()
    """Kafka's ``listeners``: every address to listen on and its security protocol; replaces host and port."""
    security: SecurityOptions = field(default_factory=SecurityOptions)
    """TLS, SASL and ACL settings (ledgerview/kafka/security_options.py)."""
    insecure: bool = False
    """Allow a listener on a non-loopback address without TLS and authentication."""
    compacted_suffix: str = ".compacted"
    """``<topic><suffix>`` serves the topic's compacted view; empty disables the compacted names."""
    advertised_listeners: tuple[Listener, ...] = ()
    """Kafka's ``advertised.listeners``: the address clients are told to connect to (Metadata, FindCoordinator) for
    the listener of each security protocol named; a listener not named is advertised with its own host and the port
    it bound, or this machine's canonical host name when its host binds every interface (advertised.py)."""
    advertised_host: str | None = None
    """ledgerview's shorthand (the service's ``[kafka] advertised_host``): advertise every listener at this host,
    with the port it bound; not with ``advertised_listeners``."""
    fetch_cache_bytes: int = 64 * 1024 * 1024
    """Memory for encoded fetch batches, so consumers reading the same offsets share one encoding; held only in
    room queued.max.request.bytes leaves free, evicted first when requests need it (batch_cache.py)."""
    socket_request_max_bytes: int = 104857600
    """Kafka's ``socket.request.max.bytes``: a request frame declaring more (or a negative size) closes its
    connection before any of its body is read; also the most one partition's produced records may decompress to
    (RECORD_LIST_TOO_LARGE past it)."""
    fetch_max_bytes: int = 57671680
    """Kafka's broker ``fetch.max.bytes``: the most one Fetch response carries, whatever ``max_bytes`` the client
    asks (a smaller client value wins); each partition gets its ``partition_max_bytes`` within what is left. The
    first partition with data still gets at least one message."""
    connections_max_idle_ms: int = 600000
    """Kafka's ``connections.max.idle.ms``: a connection that sends no request for this long is closed, and so is
    one whose frame has not fully arrived this long after its size did, or that reads none of its pending
    responses for this long."""
    max_connections: int = 2147483647
    """Kafka's ``max.connections``: a connection accepted while this many are open is closed at once."""
    max_connections_per_ip: int = 2147483647
    """Kafka's ``max.connections.per.ip``: a connection from an address that has this many open is closed at once."""
    queued_max_request_bytes: int = 104857600
    """Kafka's ``queued.max.request.bytes``: the most bytes of requests read and not answered yet, and of Fetch
    responses being built or sent (ledgerview/kafka/response_sender.py), across all connections; past it the
    endpoint reads no more request bodies and encodes no more fetched batches until room is freed (back-pressure).
    Kafka's default is -1 (unbounded, also accepted here); ledgerview's is socket.request.max.bytes, so one
    largest request still passes and a crowd of large requests cannot take the endpoint's memory."""
    offsets_retention_minutes: int = 10080
    """Kafka's ``offsets.retention.minutes``: a group with no members whose last offset commit is older than this
    loses its committed offsets (ledgerview/kafka/offsets_retention.py), checked when the endpoint starts and every
    ``offsets_retention_check_interval_ms``."""
    offsets_retention_check_interval_ms: int = 600000
    """Kafka's ``offsets.retention.check.interval.ms``."""
    frame_stall_timeout_ms: int = 30000
    """``frame.stall.timeout.ms`` (ledgerview's; Kafka waits connections.max.idle.ms): a connection whose request
    frame has started but whose next MiB (or its end) does not arrive within this long is closed, so frames sent in
    part do not hold queued.max.request.bytes for long."""
    log_flush_scheduler_interval_ms: int = 2**63 - 1
    """Kafka's ``log.flush.scheduler.interval.ms``: how often the log flusher flushes the partitions past their topic's
    ``flush.ms`` (appended to since a flush that long ago; Store.flush_due, on the event loop), so that a partition
    that goes quiet after a produce is fsynced all the same. Kafka's default, Long.MAX_VALUE: in effect never, so
    a topic that sets flush.ms wants this set too (docs/kafka.md, Flushing)."""
    group_min_session_timeout_ms: int = 6000
    """Kafka's ``group.min.session.timeout.ms``: a JoinGroup asking a shorter session timeout is refused with
    INVALID_SESSION_TIMEOUT."""
    group_max_session_timeout_ms: int = 1800000
    """Kafka's ``group.max.session.timeout.ms``: a JoinGroup asking a longer one is refused the same way, so a member
    that stops sending requests leaves its group within this long."""
    group_max_size: int = 2**31 - 1
    """Kafka's ``group.max.size``: a JoinGroup that would make a group's members more than this is refused with
    GROUP_MAX_SIZE_REACHED. Kafka's default, Int.MaxValue, is kept: a member costs the endpoint a few hundred bytes
    and only a client that joined again with the member id MEMBER_ID_REQUIRED gave it becomes one (KIP-394; a
    pending member is dropped after its session timeout, at most group.max.session.timeout.ms)."""

    def __post_init__(self) -> None:
        for name in (*SETTINGS, *GROUP_SETTINGS):
            value, unbounded = getattr(self, name), name in UNBOUNDED_AT_MINUS_ONE
            if value < 1 and not (unbounded and value == -1):
                raise ValueError(f"EndpointOptions.{name} is {value}; it must be at least 1"
                                 + (", or -1 for no bound" if unbounded else ""))
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError(f"EndpointOptions.group_min_session_timeout_ms ({self.group_min_session_timeout_ms}) is "
                             f"above group_max_session_timeout_ms ({self.group_max_session_timeout_ms}): no session "
                             "timeout would be accepted")
        check_security(self.bound_listeners, self.security, insecure=self.insecure)
        check_advertised(self.bound_listeners, self.advertised_listeners, self.advertised_host)

    @property
    def bound_listeners(self) -> tuple[Listener, ...]:
        """The listeners, or the one PLAINTEXT listener on host and port when none is given."""
        return self.listeners or (Listener(SecurityProtocol.PLAINTEXT, self.host, self.port),)


class AppendSignal:
    """Wakes fetches waiting for data when this endpoint appends; other writers are seen by polling."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), max(timeout_seconds, 0.0))


@dataclass
class Broker:
    """The single broker the endpoint pretends to be: node 0, leader of every partition, group coordinator."""

    store: Store
    options: EndpointOptions
    port: int
    appended: AppendSignal = field(default_factory=AppendSignal)
    fetch_cache: EncodedBatchCache = field(init=False)
    coordinator: GroupCoordinator = field(default_factory=GroupCoordinator)
    sequences: ProducerSequences = field(default_factory=ProducerSequences)
    heavy_work: HeavyWork = field(default_factory=HeavyWork)
    """The worker thread for decompressing produced batches, off the event loop."""
    authorizer: Authorizer | None = None
    """The ACLs enforced; None when authorizer.class.name is empty (everything allowed, as Kafka)."""
    session: Session = field(default_factory=Session)
    """Who sends the requests this broker view answers (see for_connection)."""
    advertised: tuple[str, int] = ("", 0)
    """The host and port clients on this connection are told to connect to (Metadata, FindCoordinator): those of
    the listener it arrived on, as advertised.py advertises it."""
    kept_reads: KeptReads = field(default_factory=KeptReads)
    """The partition reads made ahead for this connection's next Fetch (ledgerview/kafka/read_ahead.py)."""
    request_bytes: int = 0
    """What the pool counts for the request frame this connection is handling (its size, or the larger buffer it
    may be received into: FrameBuffers.charge), parked there while it waits for the worker thread
    (ledgerview/kafka/heavy_work.py)."""

    def __post_init__(self) -> None:
        self.fetch_cache = EncodedBatchCache(self.options.fetch_cache_bytes)

    def for_connection(self, session: Session, listener: Listener, port: int) -> Broker:
        """A view of this broker for one connection: the same store, groups and caches, that connection's
        principal, listener (which bound ``port``) and reads made ahead."""
        view = copy.copy(self)
        view.session, view.port, view.kept_reads = session, port, KeptReads()
        view.advertised = advertised_address(listener, port, self.options.advertised_listeners,
                                             self.options.advertised_host)
        return view

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Whether this connection's principal may ``operation`` the resource."""
        return self.authorizer is None or self.authorizer.authorize(self.session, operation, resource_type, name)

    def allowed_topic(self, operation: Operation, name: str) -> bool:
        """Whether this connection may ``operation`` the topic ``name``; a compacted view's name is checked as
        its stored topic (the ACLs of ``orders`` cover ``orders.compacted``)."""
        if self.authorizer is None:
            return True
        with contextlib.suppress(LedgerviewError):  # an unknown or invalid name is checked as given
            name = resolve_topic(self.store, name, self.options.compacted_suffix).topic
        return self.authorizer.authorize(self.session, operation, ResourceType.TOPIC, name)
