"""The Kafka-protocol endpoint: an asyncio server on its own thread, framing requests and dispatching them.

Per connection (ledgerview/kafka/connection.py: bytes received straight into each frame's buffer), requests are read
(4-byte size, then the frame) and answered one after another, so responses leave in request order as the protocol
requires; a long-polling Fetch holds its connection, as Kafka's does. A size above socket.request.max.bytes (or
negative) closes the connection before its body is read. A connection is closed when idle for
connections.max.idle.ms, when its frame is still incomplete that long after its size came or its frame's bytes stop
arriving for frame.stall.timeout.ms, or when it reads none of its pending responses (past WRITE_BUFFER_BYTES_MAX, or
the piece of a streamed Fetch the kernel did not take) for connections.max.idle.ms. A connection that arrives while
max.connections are open, or max.connections.per.ip from its address, is closed at once; refusals are logged at most
once a minute however many arrive (ledgerview/connection_refusals.py, as the HTTP server's refusals are), the line
that has come due written by the loop within REFUSAL_LINE_CHECK_S and the count still unwritten when the endpoint
stops. A request body is read only once the bytes of requests read and not answered yet, across all connections,
leave room for it under queued.max.request.bytes (ledgerview/kafka/request_queue.py), or once all that pool holds is
response pieces stalled on clients that do not read them: until then that socket is read no further than its staging
buffer. Large frames' buffers are reused from a free list that lives in that pool's free room (frame_buffers.py). A
Fetch response is written piece by piece, each batch encoded when its turn comes and counted in that same pool until
sent (response_sender.py); the fetch cache holds only room that pool leaves free (batch_cache.py). Freed large
buffers go back to the system (large_buffers.py), and segment pages fetches read are dropped from the process as
they are encoded (mapped_pages.py).
Connections run concurrently on one event loop, which owns the store: no locks. The loop also runs Kafka's log
flusher: every log.flush.scheduler.interval.ms (by default Kafka's, in effect never) it calls Store.flush_due, so
that a partition that goes quiet after a produce is still fsynced, and its recovery point moved, once its topic's
flush.ms has passed. The fsync holds up the loop as long as it takes, as the flushes flush.messages and flush.ms
make inside a produce already do: a thread of its own would share the store, whose objects are not shared across
threads (storage/periodic.py).

Every listener (EndpointOptions.bound_listeners) is a server on that loop. On SSL and SASL_SSL listeners the
connection is TLS (ledgerview/kafka/tls.py); an SSL client's principal is its certificate's subject. On SASL
listeners the connection first authenticates (ledgerview/kafka/authentication.py) and only then is served, as
``User:<name>``. With an authorizer, every handler checks the connection's principal against the ACLs.

Version handling follows Kafka: an ApiVersions request of a version we do not speak gets the v0-format error
reply listing our ApiVersions range (closing instead would stop every client's bootstrap); any other request of
an unknown key or version closes the connection. A handler failure is logged and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ledgerview.connection_refusals import RefusalLog, RefusalSummary
from ledgerview.kafka.acl_admin import handle_create_acls, handle_delete_acls, handle_describe_acls
from ledgerview.kafka.advertised import WILDCARD_HOSTS, canonical_host_name
from ledgerview.kafka.authentication import (
    SaslAuthenticator,
    handle_sasl_authenticate,
    handle_sasl_handshake,
)
from ledgerview.kafka.authorizer import ANONYMOUS, Authorizer, Session
from ledgerview.kafka.broker import Broker, EndpointOptions
from ledgerview.kafka.connection import KafkaConnection
from ledgerview.kafka.fetch import handle_fetch
from ledgerview.kafka.fetch_response import FramedResponse, StreamedFetchResponse
from ledgerview.kafka.frame_buffers import FrameBuffers
from ledgerview.kafka.group_admin import (
    handle_delete_groups,
    handle_describe_groups,
    handle_list_groups,
    handle_offset_delete,
)
from ledgerview.kafka.group_offsets import handle_offset_commit, handle_offset_fetch
from ledgerview.kafka.groups import handle_heartbeat, handle_join_group, handle_leave_group, handle_sync_group
from ledgerview.kafka.heavy_work import HeavyWork
from ledgerview.kafka.large_buffers import return_large_buffers
from ledgerview.kafka.mapped_pages import MappedPages
from ledgerview.kafka.metadata import (
    api_versions_response,
    handle_api_versions,
    handle_find_coordinator,
    handle_init_producer_id,
    handle_metadata,
)
from ledgerview.kafka.offsets import handle_list_offsets, handle_offset_for_leader_epoch
from ledgerview.kafka.offsets_retention import expire_group_offsets
from ledgerview.kafka.produce import handle_produce
from ledgerview.kafka.protocol import (
    REQUEST_CLASSES,
    ApiKey,
    ErrorCode,
    MalformedRequestError,
    encode_response,
    read_request_header,
    supported,
)
from ledgerview.kafka.request_queue import QueuedRequestBytes
from ledgerview.kafka.response_sender import WRITE_BUFFER_BYTES_MAX, ResponseSender
from ledgerview.kafka.sasl_errors import SaslProtocolError
from ledgerview.kafka.security_options import Listener, SecurityProtocol
from ledgerview.kafka.tls import certificate_principal, server_context
from storage import Store
from storage.errors import LedgerviewError
from storage.security_records import credentials_record

log = logging.getLogger(__name__)

Handler = Callable[[Broker, Any, int], Any]
HANDLERS: dict[ApiKey, Handler] = {
    ApiKey.PRODUCE: handle_produce,
    ApiKey.FETCH: handle_fetch,
    ApiKey.LIST_OFFSETS: handle_list_offsets,
    ApiKey.METADATA: handle_metadata,
    ApiKey.OFFSET_COMMIT: handle_offset_commit,
    ApiKey.OFFSET_FETCH: handle_offset_fetch,
    ApiKey.FIND_COORDINATOR: handle_find_coordinator,
    ApiKey.JOIN_GROUP: handle_join_group,
    ApiKey.HEARTBEAT: handle_heartbeat,
    ApiKey.LEAVE_GROUP: handle_leave_group,
    ApiKey.SYNC_GROUP: handle_sync_group,
    ApiKey.DESCRIBE_GROUPS: handle_describe_groups,
    ApiKey.LIST_GROUPS: handle_list_groups,
    ApiKey.DELETE_GROUPS: handle_delete_groups,
    ApiKey.OFFSET_DELETE: handle_offset_delete,
    ApiKey.API_VERSIONS: handle_api_versions,
    ApiKey.INIT_PRODUCER_ID: handle_init_producer_id,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: handle_offset_for_leader_epoch,
    ApiKey.SASL_HANDSHAKE: handle_sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: handle_sasl_authenticate,
    ApiKey.DESCRIBE_ACLS: handle_describe_acls,
    ApiKey.CREATE_ACLS: handle_create_acls,
    ApiKey.DELETE_ACLS: handle_delete_acls,
}
FRAME_CHUNK_BYTES = 1024 * 1024
"""A frame's body must progress this much (or end) within frame.stall.timeout.ms."""
GROUP_TIMER_SECONDS = 0.25
GROUP_TIMER_ERROR_LOG_S = 60.0
"""How often the group timer logs an expiry pass that keeps failing the same way."""
REFUSAL_LINE_CHECK_S = 0.5
"""How often the loop writes the line about refused connections once it is due, so the last refusals of a burst are
logged when their interval passes even if no connection follows."""


class EndpointStartError(LedgerviewError):
    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"The Kafka endpoint could not listen on {host}:{port}: {reason}. Choose another port "
                         "(0 picks a free one) or stop what holds it.")


class _Close(Exception):
    """The connection must be closed (Kafka's answer to a request it cannot parse or a limit it passes)."""


async def dispatch(broker: Broker, frame: memoryview) -> bytes | FramedResponse:
    """The framed response to one request frame (a Fetch's to be written piece by piece, ResponseSender); b""
    when none is due (acks=0). Raises _Close."""
    try:
        header = read_request_header(frame)
    except MalformedRequestError as error:
        raise _Close(str(error)) from error
    if not supported(header.api_key, header.api_version):
        if header.api_key == ApiKey.API_VERSIONS:
            return encode_response(api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION), header.correlation_id)
        raise _Close(f"unsupported request: key {header.api_key} version {header.api_version}")
    key = ApiKey(header.api_key)
    body = memoryview(frame)[header.body_start :]
    try:
        request = REQUEST_CLASSES[key].decode(body, version=header.api_version)
    except (ValueError, struct.error, IndexError, UnicodeDecodeError) as error:
        raise _Close(f"request {key.name} v{header.api_version} does not parse: {error}") from error
    response = HANDLERS[key](broker, request, header.api_version)
    if inspect.isawaitable(response):
        response = await response
    if isinstance(response, StreamedFetchResponse):
        return response.framed(header.correlation_id)
    return b"" if response is None else encode_response(response, header.correlation_id)


async def read_frame(connection: KafkaConnection, options: EndpointOptions, *, max_bytes: int | None = None,
                     pool: QueuedRequestBytes | None = None, buffers: FrameBuffers | None = None) -> memoryview:
    """The next request frame, whole; raises _Close, or IncompleteReadError (or ConnectionError) when the client
    left. ``max_bytes`` defaults to socket.request.max.bytes; with ``pool`` the frame is counted there until the
    caller releases it; with ``buffers`` its buffer comes from (and should go back to) them. The steps:

    1. Wait for the size, at most connections.max.idle.ms. A size outside 1 to the limit closes the connection
       before any of the body is read (Kafka's InvalidReceiveException).
    2. With a pool, wait until the frame fits queued.max.request.bytes and count it there, at the largest buffer
       ``buffers`` may give it (``FrameBuffers.charge``; the caller releases that much). Meanwhile the connection
       receives at most its staging buffer, then stops reading. On any failure below it is released.
    3. Take a buffer for it and receive the body into it: every FRAME_CHUNK_BYTES (or the end) must arrive within
       frame.stall.timeout.ms, and the whole body within connections.max.idle.ms of its size."""
    limit = options.socket_request_max_bytes if max_bytes is None else max_bytes
    idle_seconds = options.connections_max_idle_ms / 1000
    size = connection.take_size()
    if size is None:
        try:
            async with asyncio.timeout(idle_seconds):
                size = await connection.read_size()
        except TimeoutError:
            raise _Close(f"idle for connections.max.idle.ms={options.connections_max_idle_ms}") from None
    if not 0 < size <= limit:
        raise _Close(f"a frame of {size} bytes, outside 1 to {limit} (socket.request.max.bytes, or "
                     "sasl.server.max.receive.size before authentication)")
    charged = buffers.charge(size) if buffers is not None else size
    if pool is not None:
        await pool.reserve(charged)
    try:
        frame = buffers.take(size) if buffers is not None else memoryview(bytearray(size))
        received = connection.start_frame(frame)
        if received < size:
            try:
                async with asyncio.timeout(idle_seconds):
                    await _receive_body(connection, size, received, options)
            except TimeoutError:
                raise _Close(f"a frame of {size} bytes not complete after connections.max.idle.ms="
                             f"{options.connections_max_idle_ms}") from None
    except BaseException:
        connection.end_frame()
        if pool is not None:
            pool.release(charged)
        raise
    return frame


async def _receive_body(connection: KafkaConnection, size: int, received: int, options: EndpointOptions) -> None:
    while received < size:
        try:
            async with asyncio.timeout(options.frame_stall_timeout_ms / 1000):
                received = await connection.read_frame_bytes(min(size, received + FRAME_CHUNK_BYTES))
        except TimeoutError:
            raise _Close(f"a frame of {size} bytes stalled with {size - received} to come: nothing for "
                         f"frame.stall.timeout.ms={options.frame_stall_timeout_ms}") from None


async def drain(connection: KafkaConnection, options: EndpointOptions) -> None:
    """Wait until the client reads enough of its responses; one that reads none for connections.max.idle.ms is
    reset (closing would wait for the unread responses to be sent) and raises _Close."""
    try:
        async with asyncio.timeout(options.connections_max_idle_ms / 1000):
            await connection.drain()
    except TimeoutError:
        client = connection.get_extra_info("socket")
        if client is not None:  # linger 0: a reset, and the kernel drops what it still holds for the client
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.transport.abort()
        raise _Close(f"responses unread for connections.max.idle.ms={options.connections_max_idle_ms}") from None


CLOSE_WAIT_S = 1.0
"""How long a closing connection waits for its transport to finish closing (a TLS close needs the peer)."""


def _log_refusals(summary: RefusalSummary) -> None:
    """One line for the connections refused (max.connections, max.connections.per.ip) since the line before."""
    untallied = summary.refused_from_addresses_not_tallied
    log.info("Kafka connections refused since the last such line (max.connections or max.connections.per.ip "
             "reached): %d; addresses: %d%s; most from %s: %d; logged at most every %g s", summary.refused,
             summary.addresses, f" (and {untallied} refusals from addresses not tallied)" if untallied else "",
             summary.top_client, summary.top_client_refused, summary.interval_s)


class KafkaEndpoint:
    """Serves the data folder at ``store_path`` to Kafka clients until ``stop``; ``start`` returns once it
    listens (``port`` then holds the real port when 0 was asked for)."""

    def __init__(self, store_path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 9092,
                 compacted_suffix: str = ".compacted", *, options: EndpointOptions | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` (monotonic seconds) says when the next line about refused connections is due."""
        self.store_path = store_path
        self.options = options or EndpointOptions(host=host, port=port, compacted_suffix=compacted_suffix)
        self.port = self.options.port
        self.ports: list[int] = []
        """Once started, the port of each listener, in the order of options.bound_listeners."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._open: Counter[str] = Counter()
        """Open connections per client address (touched only on the event loop)."""
        self._refusals = RefusalLog(_log_refusals, clock=clock)
        """Connections refused by max.connections or max.connections.per.ip, logged at most once a minute."""
        self._handlers: set[asyncio.Task[None]] = set()
        """The task serving each open connection, ended and awaited when the endpoint stops."""
        limit = self.options.queued_max_request_bytes
        self._queued = QueuedRequestBytes(limit if limit > 0 else sys.maxsize)
        """Bytes of requests read and not answered (queued.max.request.bytes), on the event loop only."""
        self._buffers = FrameBuffers(self._queued)
        """Buffers of large request frames, reused while the pool has room for them (evicted first)."""
        self._mapped_pages = MappedPages(store_path)
        """Drops the pages of segments that fetches read from the process's RSS (mapped_pages.py)."""

    def start(self) -> KafkaEndpoint:
        if any(listener.host in WILDCARD_HOSTS for listener in self.options.bound_listeners):
            canonical_host_name()  # may ask DNS: here, not on the event loop when the first client connects
        self._thread = threading.Thread(target=self._run, name="kafka-endpoint", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            self._thread.join()
            raise EndpointStartError(self.options.host, self.options.port, str(self._failure)) from self._failure
        return self

    def port_of(self, protocol: SecurityProtocol) -> int:
        """The port of the first listener of ``protocol``."""
        listeners = self.options.bound_listeners
        return next(port for listener, port in zip(listeners, self.ports, strict=True) if listener.protocol is protocol)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join()
            self._loop = None

    def __enter__(self) -> KafkaEndpoint:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        return_large_buffers()  # freed frames and batches leave RSS (ledgerview/kafka/large_buffers.py)
        self._stopping = asyncio.Event()
        servers: list[asyncio.Server] = []
        store: Store | None = None
        broker: Broker | None = None
        try:
            store = Store.open(self.store_path)
            security = self.options.security
            authorizer = Authorizer(Path(self.store_path), security) if security.authorizer_class_name else None
            broker = Broker(store, self.options, self.options.port, heavy_work=HeavyWork(self._queued),
                            authorizer=authorizer)
            broker.fetch_cache.count_in(self._queued)
            for listener in self.options.bound_listeners:
                servers.append(await self._listen(broker, listener))
        except (OSError, LedgerviewError) as error:
            self._failure = error
            self._started.set()
            await self._close(servers, store, broker)
            return
        self.port = broker.port = self.ports[0]
        timer = asyncio.create_task(self._group_timer(broker))
        retention = asyncio.create_task(self._offsets_retention(broker))
        refusal_lines = asyncio.create_task(self._refusal_lines())
        flusher = self._log_flusher(store)
        self._started.set()
        try:
            await self._stopping.wait()
        finally:
            timer.cancel()
            retention.cancel()
            refusal_lines.cancel()
            for handler in self._handlers:
                handler.cancel()
            # Each handler closes its connection and waits for the close, so no transport outlives the loop.
            await asyncio.gather(*self._handlers, return_exceptions=True)
            flusher.cancel()
            self._refusals.close()  # no connection arrives any more: the count not logged yet
            await self._close(servers, store, broker)

    def _log_flusher(self, store: Store) -> asyncio.Task[None]:
        """Store.flush_due every log.flush.scheduler.interval.ms (Kafka's default, Long.MAX_VALUE, in effect
        never)."""
        interval_s = self.options.log_flush_scheduler_interval_ms / 1000

        async def flush_due() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    store.flush_due()
                except (LedgerviewError, OSError):
                    log.exception("flushing partitions due by flush.ms failed")

        return asyncio.create_task(flush_due())

    async def _listen(self, broker: Broker, listener: Listener) -> asyncio.Server:
        security = self.options.security
        context = None
        if listener.protocol.tls:
            client_auth = security.ssl_client_auth if listener.protocol is SecurityProtocol.SSL else "none"
            context = server_context(security, client_auth)
        port: list[int] = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: KafkaConnection(lambda connection: self._connection(broker, listener, port[0], connection)),
            listener.host or None, listener.port, ssl=context)
        port.append(server.sockets[0].getsockname()[1])
        self.ports.append(port[0])
        return server

    @staticmethod
    async def _close(servers: list[asyncio.Server], store: Store | None, broker: Broker | None) -> None:
        for server in servers:
            server.close()
            await server.wait_closed()
        if broker is not None:
            broker.heavy_work.close()
            broker.sequences.close()  # producer state snapshots: a clean shutdown
        if store is not None:
            store.close()

    async def _group_timer(self, broker: Broker) -> None:
        """The coordinator's expiry every GROUP_TIMER_SECONDS. A failing pass is logged and the next one runs, since
        a timer that ended would expire no member of any group again; the same error is logged once per
        GROUP_TIMER_ERROR_LOG_S, not four times a second."""
        last_error, last_logged = "", 0.0
        while True:
            await asyncio.sleep(GROUP_TIMER_SECONDS)
            try:
                broker.coordinator.expire()
            except Exception as error:  # any bug in a pass must not end the timer
                now, text = time.monotonic(), f"{type(error).__name__}: {error}"
                if text != last_error or now - last_logged >= GROUP_TIMER_ERROR_LOG_S:
                    log.exception("expiring group members and rebalances failed; the group timer goes on")
                    last_error, last_logged = text, now

    async def _refusal_lines(self) -> None:
        while True:
            await asyncio.sleep(REFUSAL_LINE_CHECK_S)
            self._refusals.write_due()

    async def _offsets_retention(self, broker: Broker) -> None:
        """Expire old offsets of empty groups now and every offsets.retention.check.interval.ms."""
        while True:
            try:
                expire_group_offsets(broker.store, broker.coordinator,
                                     retention_minutes=self.options.offsets_retention_minutes,
                                     now_ms=broker.store.clock())
            except (LedgerviewError, OSError):
                log.exception("expiring committed offsets (offsets.retention.minutes) failed")
            await asyncio.sleep(self.options.offsets_retention_check_interval_ms / 1000)

    async def _connection(self, shared: Broker, listener: Listener, port: int, connection: KafkaConnection) -> None:
        address = str((connection.get_extra_info("peername") or ("?",))[0])
        if (sum(self._open.values()) >= self.options.max_connections
                or self._open[address] >= self.options.max_connections_per_ip):
            self._refusals.refused(address)
            connection.close()
            return
        self._open[address] += 1
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        sender = ResponseSender(connection, self._queued, lambda: drain(connection, self.options))
        broker: Broker | None = None
        try:
            principal = await self._authenticate(listener, address, connection)
            if principal is None:
                return
            broker = shared.for_connection(Session(principal, address), listener, port)
            while True:
                frame = await read_frame(connection, self.options, pool=self._queued, buffers=self._buffers)
                broker.request_bytes = charged = self._buffers.charge(len(frame))
                try:
                    response = await dispatch(broker, frame)
                finally:
                    self._queued.release(charged)
                    self._buffers.give_back(frame)
                if isinstance(response, FramedResponse):
                    await sender.send(self._mapped_pages.watching(response))
                    if response.read_ahead is not None:
                        await sender.prepare(response.read_ahead(), lambda: connection.has_unread)
                elif response:
                    connection.write(response)
                    if connection.transport.get_write_buffer_size() > WRITE_BUFFER_BYTES_MAX:
                        await drain(connection, self.options)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the endpoint is stopping
        except _Close as reason:
            log.info("closing a Kafka connection: %s", reason)
        except Exception:
            log.exception("a Kafka request failed; closing its connection")
        finally:
            self._open[address] -= 1
            self._handlers.discard(handler)
            sender.close()
            if broker is not None:
                broker.kept_reads.drop()
            connection.close()
            with contextlib.suppress(Exception):  # a peer that never finishes TLS's close must not hold a stop
                await asyncio.wait_for(connection.wait_closed(), CLOSE_WAIT_S)


    async def _authenticate(self, listener: Listener, address: str, connection: KafkaConnection) -> str | None:
        """The connection's principal: its SASL user on a SASL listener (None when authentication failed and the
        connection must close), else its verified certificate's subject, else User:ANONYMOUS."""
        if not listener.protocol.sasl:
            return certificate_principal(connection.get_extra_info("peercert")) or ANONYMOUS
        security = self.options.security
        credentials = credentials_record(Path(self.store_path))
        authenticator = SaslAuthenticator(security.sasl_enabled_mechanisms, credentials.read)
        while authenticator.user is None:
            frame = await read_frame(connection, self.options, max_bytes=security.sasl_server_max_receive_size)
            try:
                reply = authenticator.receive(bytes(frame))
            except (SaslProtocolError, MalformedRequestError) as error:
                raise _Close(f"SASL authentication from {address}: {error}") from None
            if reply.failed:
                log.info("failed SASL authentication from %s on %s", address, listener)
                await asyncio.sleep(security.connection_failed_authentication_delay_ms / 1000)
                connection.write(reply.frame)
                await drain(connection, self.options)
                return None
            connection.write(reply.frame)
        return f"User:{authenticator.user}"


def serve(store_path: str | os.PathLike[str], options: EndpointOptions, stop: threading.Event) -> None:
    """Run the endpoint until ``stop`` is set: the call the service makes for its Kafka config section."""
    with KafkaEndpoint(store_path, options=options):
        stop.wait()
