"""The service process: wires the store, the ingest sources, the periodic loops and the HTTP endpoint together.

Start:

1. Read and check the config (nothing starts on a bad one); take the service lock of the data folder (a second
   service there is refused: it would ingest every source twice); open the store with its remote tier ([remote]
   uri, which the folder then remembers for every other store the service opens; the store recovers every
   partition it touches: torn tails cut, indexes rebuilt) and create the configured topics that are missing.
2. Start the HTTP endpoint and the Kafka-protocol endpoint (when [kafka] enabled), then the loops (compaction
   scheduler, retention, in-place cleaner, remote upload), then the ingest workers, each of which first recovers
   its source (ledgerview/service/ingest.py).
3. Log ``service.started`` with the HTTP address.

Stop, on SIGTERM or SIGINT:

1. Stop the ingest workers: each finishes its append, flushes the topic and writes its final checkpoint.
2. Stop the loops after the pass in progress.
3. Stop the Kafka-protocol endpoint (its store flushes what clients produced), the HTTP endpoint, flush and close
   the store, log ``service.stopped``.

After ``kill -9`` nothing needs cleaning by hand: the next start recovers the partitions, the compactor removes
orphan ledgers of an interrupted run, and each worker replays what its checkpoint does not cover.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from compactor.run import CompactionResult
from compactor.scheduler import CompactionScheduler
from ledgerview.errors import ListenError, ServiceRunningError
from ledgerview.kafka.server import KafkaEndpoint
from ledgerview.service.config import ServiceConfig
from ledgerview.service.history import STEP_S, CompactionCounters, RateHistory
from ledgerview.service.http import StatusServer
from ledgerview.service.ingest import SERVICE_FOLDER, IngestStats, IngestWorker
from ledgerview.service.logs import configure_logging, log_event
from ledgerview.service.sources import open_source
from ledgerview.service.status import service_status
from storage import Store
from storage.cleaner import CleanerStats
from storage.errors import LedgerviewError, PartitionLockedError, UnknownTopicError
from storage.locks import FileLock
from storage.maintenance import CleanerLoop
from storage.object_store import RemoteStorageError, open_object_store
from storage.periodic import PeriodicCall, PeriodicLoop, PeriodicTask
from storage.remote_tier import RemoteSyncResult
from storage.retention import DeletedSegment, RetentionLoop

if TYPE_CHECKING:
    from ledgerview.service.spark_ingest import SparkIngest

logger = logging.getLogger("ledgerview.service")
SERVICE_LOCK = ".service.lock"


class Component(Protocol):
    """A part the service starts and stops: a loop, an ingest worker, the HTTP endpoint, the Kafka-protocol
    endpoint."""

    def start(self) -> object: ...

    def stop(self) -> None: ...


class IngestStatus(Protocol):
    """What the status endpoint reads of a source, whichever engine runs it."""

    @property
    def name(self) -> str: ...

    @property
    def topic(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def stats(self) -> IngestStats: ...


class Service:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.started_ms = time.time_ns() // 1_000_000
        self.workers: list[IngestWorker] = []
        self.spark: SparkIngest | None = None
        self.loops: list[PeriodicTask[Any]] = []
        self.cleaner: CleanerLoop | None = None
        """Its store's cleaner manager (thread-safe) knows each partition's cleaning state."""
        self.remote: _RemoteUploadLoop | None = None
        """Knows how far each tiered partition is uploaded, for the status."""
        self.http: StatusServer | None = None
        self.kafka: KafkaEndpoint | None = None
        self.compaction = CompactionCounters()
        self.history = RateHistory(lambda: {"ingested": float(sum(i.stats.messages for i in self.ingests)),
                                            "compacted": float(self.compaction.messages_read)})
        self._stopping = threading.Event()
        self._lock = FileLock(config.data / SERVICE_FOLDER / SERVICE_LOCK, wait=False)

    # -------------------------------------------------------------------------------------------- lifecycle
    def run(self) -> int:
        """Start, wait for SIGTERM or SIGINT, stop; returns the exit status."""
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, self._on_signal)
        self.start()
        while not self._stopping.wait(0.5):
            pass
        self.stop()
        return 0

    def start(self) -> None:
        config = self.config
        (config.data / SERVICE_FOLDER).mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(wait=False)
        except PartitionLockedError:
            raise ServiceRunningError(str(config.data), str(self._lock.path)) from None
        # The listeners first: a port in use stops the service before it changed anything.
        if config.http.enabled:
            self.http = listening("http", config.http.host, config.http.port, lambda: StatusServer(
                config.http.host, config.http.port, config.data, self.status, self.health,
                tls=config.http.tls_context(), access=config.http.access(config.data),
                max_connections=config.http.max_connections,
                max_connections_per_ip=config.http.max_connections_per_ip))
        if config.kafka.enabled:
            self.kafka = listening("kafka", config.kafka.host, config.kafka.port, lambda: KafkaEndpoint(
                config.data, options=config.kafka.endpoint_options()))
        if config.remote.uri:
            open_object_store(config.remote.uri)  # a URI pyarrow cannot open stops here, before the folder keeps it
        with Store.open(config.data, remote=config.remote.uri or None) as store:
            for topic in config.topics:
                if topic.name not in store.list_topics():
                    store.create_topic(topic.name, partitions=topic.partitions, config=topic.config)
                    log_event(logger, logging.INFO, "topic.created", topic=topic.name, partitions=topic.partitions)
            self.loops = self._loops(store)
        on_spark = [s for s in config.sources
                    if config.spark.enabled and s.type in ("directory", "topic", "kafka")]
        self.workers = [IngestWorker(open_source(section), config.data, interval_s=section.interval_s,
                                     flush_interval_s=config.service.flush_interval_s, kind=section.type)
                        for section in config.sources if section not in on_spark]
        if on_spark:
            from ledgerview.service.spark_ingest import SparkIngest  # pyspark only where Spark is asked for

            self.spark = SparkIngest(on_spark, config.data, config.spark)
        for component in self._components():
            component.start()
        log_event(logger, logging.INFO, "service.started", data=str(config.data.resolve()),
                  http=self.http.address if self.http else None,
                  kafka=f"{config.kafka.host}:{self.kafka.port}" if self.kafka else None,
                  sources=[s.name for s in self.config.sources],
                  loops=[loop.name for loop in self.loops], config=config.path)

    def stop(self) -> None:
        log_event(logger, logging.INFO, "service.stopping")
        for component in reversed(self._components()):
            component.stop()
        self._lock.__exit__(None, None, None)
        log_event(logger, logging.INFO, "service.stopped",
                  messages={ingest.name: ingest.stats.messages for ingest in self.ingests})

    @property
    def ingests(self) -> list[IngestStatus]:
        return [*self.workers, *(self.spark.sources if self.spark else [])]

    def _components(self) -> list[Component]:
        http: list[Component] = [self.http] if self.http else []
        kafka: list[Component] = [self.kafka] if self.kafka else []
        spark: list[Component] = [self.spark] if self.spark else []
        return [*http, *kafka, *self.loops, *self.workers, *spark]

    def _on_signal(self, signal_number: int, frame: FrameType | None) -> None:
        log_event(logger, logging.INFO, "service.signal", signal=signal.Signals(signal_number).name)
        self._stopping.set()

    # ------------------------------------------------------------------------------------------------ loops
    def _loops(self, store: Store) -> list[PeriodicTask[Any]]:
        """The loops the config turns on, each with a store of its own opened like ``store``."""
        config = self.config
        loops: list[PeriodicTask[Any]] = []
        if config.compaction.enabled:
            loops.append(_CompactionLoop(store, interval_s=config.compaction.interval_s, counters=self.compaction))
        if config.retention.enabled:
            loops.append(_RetentionLoop(store, interval_s=config.retention.interval_s))
        if config.cleaner.enabled:
            self.cleaner = _CleanerLoop(store, interval_s=config.cleaner.interval_s)
            loops.append(self.cleaner)
        if config.remote.enabled and store.remote is not None:
            self.remote = _RemoteUploadLoop(store, interval_s=config.remote.interval_s)
            loops.append(self.remote)
        loops.append(_LoggedCall("history", lambda: self.history.sample(time.time()), interval_s=STEP_S))
        return loops

    # ----------------------------------------------------------------------------------------------- status
    def health(self) -> dict[str, Any]:
        """What /health answers: from the service's own counters, without reading the store (milliseconds
        whatever the number of partitions)."""
        failed = [ingest.name for ingest in self.ingests if ingest.stats.state == "failed"]
        return {"status": "degraded" if failed else "ok", "failed_sources": failed,
                "uptime_s": round((time.time_ns() // 1_000_000 - self.started_ms) / 1000, 3)}

    def status(self, store: Store) -> dict[str, Any]:
        sources = [{"name": ingest.name, "topic": ingest.topic, "type": ingest.kind, **asdict(ingest.stats)}
                   for ingest in self.ingests]
        loops = {loop.name: {"interval_s": loop.interval_s, **asdict(loop.stats)} for loop in self.loops}
        topic_errors: dict[str, list[str]] = {}
        for loop in self.loops:
            for topic, error in loop.stats.topic_errors.items():
                topic_errors.setdefault(topic, []).append(f"{loop.name}: {error}")
        for ingest, source in zip(self.ingests, sources, strict=True):
            if source["last_error"]:
                topic_errors.setdefault(ingest.topic, []).append(f"source {ingest.name}: {source['last_error']}")
        status = service_status(store, started_ms=self.started_ms, now_ms=time.time_ns() // 1_000_000,
                                sources=sources, loops=loops, topic_errors=topic_errors,
                                cleaner=self.cleaner.store.cleaner if self.cleaner else None)
        return {**status, "compaction_counters": asdict(self.compaction), "rates": self.history.rates()}


class _Logged(PeriodicTask[Any]):
    """The service's log line for a failure: ``<loop>.failed`` with the error (and the topic, for a topic a pass
    failed on)."""

    def report_failure(self, error: str, *, topic: str | None = None) -> None:
        log_event(logger, logging.ERROR, f"{self.name}.failed", **({} if topic is None else {"topic": topic}),
                  error=error)


class _CompactionLoop(_Logged, CompactionScheduler):
    """Logs each compaction and adds it to the service's counters (a failed run is its partition's ERROR status,
    which the status endpoint shows)."""

    def __init__(self, store: Store, *, interval_s: float, counters: CompactionCounters) -> None:
        super().__init__(store, interval_s=interval_s)
        self.counters = counters

    def check_once(self) -> list[tuple[str, CompactionResult]]:
        started = time.monotonic()
        done = super().check_once()
        for topic, result in done:
            log_event(logger, logging.INFO, "compaction.done", topic=topic, partition=result.partition,
                      ledger=result.ledger_id, horizon=result.horizon, read=result.messages_read,
                      kept=result.messages_kept, removed=result.messages_removed)
            self.counters.runs += 1
            self.counters.skipped += result.skipped
            self.counters.messages_read += result.messages_read
            self.counters.messages_kept += 0 if result.skipped else result.messages_kept
            self.counters.last_success_ms = time.time_ns() // 1_000_000
        self.counters.seconds += time.monotonic() - started
        return done


class _RetentionLoop(_Logged, RetentionLoop):
    def run_once(self, now_ms: int | None = None) -> list[DeletedSegment]:
        deleted = super().run_once(now_ms)
        for segment in deleted:
            log_event(logger, logging.INFO, "retention.deleted", topic=segment.topic, partition=segment.partition,
                      base_offset=segment.base_offset, next_offset=segment.next_offset,
                      size_bytes=segment.size_bytes, reason=segment.reason.value)
        return deleted


class _CleanerLoop(_Logged, CleanerLoop):
    def run_once(self, now_ms: int | None = None) -> list[CleanerStats]:
        cleaned = super().run_once(now_ms)
        for stats in cleaned:
            log_event(logger, logging.INFO, "cleaner.cleaned", topic=stats.topic, partition=stats.partition,
                      first_dirty_offset=stats.first_dirty_offset, end_offset=stats.end_offset,
                      dirty_ratio=round(stats.dirty_ratio, 4), read=stats.messages_read,
                      written=stats.messages_written, tombstones_removed=stats.tombstones_removed)
        return cleaned


class _RemoteUploadLoop(_Logged, PeriodicLoop[list[RemoteSyncResult]]):
    """Uploads the sealed segments of every tiered topic (Kafka's remote log manager copy task) and logs each
    partition that uploaded something. A remote tier that is down fails the pass (counted and logged; the next pass
    tries again; appends go on locally, and the upload lag grows); a topic refused for a reason of its own (another
    data folder claimed a partition's remote log, a damaged manifest) is a topic error, and the other topics go on."""

    def __init__(self, store: Store, *, interval_s: float) -> None:
        super().__init__("remote", store, interval_s=interval_s)

    def run_once(self) -> list[RemoteSyncResult]:
        results: list[RemoteSyncResult] = []
        failures: dict[str, str] = {}
        try:
            for topic in self.store.list_topics():
                try:
                    if self.store.topic_metadata(topic).config.remote_storage_enable:
                        results += self._sync(topic)
                except UnknownTopicError:  # deleted meanwhile
                    continue
                except RemoteStorageError:
                    raise
                except LedgerviewError as error:
                    failures[topic] = f"{type(error).__name__}: {error}"
        finally:
            self.stats.topic_errors = failures
        return results

    def _sync(self, topic: str) -> list[RemoteSyncResult]:
        results = self.store.sync_remote(topic)
        for result in results:
            if result.uploaded:
                log_event(logger, logging.INFO, "remote.uploaded", topic=topic, partition=result.partition,
                          segments=len(result.uploaded), size_bytes=sum(s.size_bytes for s in result.uploaded),
                          remote_end_offset=result.remote_end_offset)
        return results


class _LoggedCall(_Logged, PeriodicCall):
    """A plain callable every ``interval_s`` seconds, its failures logged the service's way."""


Listener = TypeVar("Listener")


def listening(section: str, host: str, port: int, open_listener: Callable[[], Listener]) -> Listener:
    """``open_listener()``, or an error naming the address and the config key when it cannot listen there."""
    try:
        return open_listener()
    except OSError as error:
        raise ListenError(section, host, port, error.strerror or str(error)) from None


def serve(config: ServiceConfig) -> int:
    configure_logging(config.service.log_level)
    return Service(config).run()
