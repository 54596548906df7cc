"""A sealed segment read from the remote tier: the same batches and indexes as a local segment, fetched as objects.

The log object is fetched whole on first read (one request) and kept in a byte-bounded cache shared by a store's
partitions, so a scan over remote segments holds at most the cache plus the segment being read; batches are decoded
from the fetched buffer without copies, as from a memory map. CRCs are checked on every fresh fetch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from storage.errors import CorruptSegmentError
from storage.files import LOG_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX
from storage.index import OffsetIndex, TimeIndex
from storage.object_store import ObjectStore, RemoteObjectMissingError
from storage.segment import SegmentReads

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class RemoteSegmentInfo:
    """One uploaded segment as the remote log's manifest lists it."""

    base_offset: int
    next_offset: int
    size_bytes: int
    first_timestamp: int
    max_timestamp: int
    stem: str
    """Key of its objects without suffix, relative to the remote URI: ``prices-0/segments/<base>-<uuid>``; the
    log, offset index and time index are ``stem + .log / .index / .timeindex``."""
    offset_shift: int = 0
    """Added to the offsets its bytes hold (storage/segment.py): 0 for an uploaded local segment, ``base_offset``
    for one a Spark task wrote from offset 0 before the commit placed it (streaming/remote_sink.py)."""

    @property
    def log_key(self) -> str:
        return self.stem + LOG_SUFFIX

    @property
    def offset_index_key(self) -> str:
        return self.stem + OFFSET_INDEX_SUFFIX

    @property
    def time_index_key(self) -> str:
        return self.stem + TIME_INDEX_SUFFIX

    @property
    def object_keys(self) -> tuple[str, str, str]:
        return self.log_key, self.offset_index_key, self.time_index_key


class FetchCache:
    """Fetched objects, least recently used dropped first once their bytes pass ``capacity_bytes``. Thread-safe;
    a buffer handed out stays valid after it is dropped (Arrow counts its references). ``prefetch`` fetches on a
    background thread, so a scan reads segment n + 1 from the remote tier while it decodes segment n; what it
    fetched is a cache entry as soon as it arrives, so a prefetch that no read collects is dropped as any other."""

    def __init__(self, capacity_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, pa.Buffer] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[str, Future[pa.Buffer]] = {}
        self._unread: set[str] = set()
        """Entries a prefetch put in that no ``get`` has handed out yet: their first ``get`` says fetched."""
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledgerview-remote-fetch")

    def prefetch(self, key: str, fetch: Callable[[], pa.Buffer]) -> None:
        """Start fetching ``key`` unless it is cached or on its way (a failed fetch is retried by ``get``)."""
        with self._lock:
            if key not in self._entries and key not in self._pending:
                self._pending[key] = self._fetcher.submit(self._prefetched, key, fetch)

    def _prefetched(self, key: str, fetch: Callable[[], pa.Buffer]) -> pa.Buffer:
        try:
            fetched = fetch()
        except BaseException:
            with self._lock:
                self._pending.pop(key, None)
            raise
        with self._lock:  # pending until cached: a get meanwhile waits for it rather than fetching again
            self._pending.pop(key, None)
            if key not in self._entries:
                self._put(key, fetched)
                self._unread.add(key)
        return fetched

    def get(self, key: str, fetch: Callable[[], pa.Buffer]) -> tuple[pa.Buffer, bool]:
        """The cached object, or ``fetch()`` put in the cache; the flag says whether it was fetched for this call
        (now, or by a prefetch no earlier call collected)."""
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                unread = key in self._unread
                self._unread.discard(key)
                return cached, unread
            pending = self._pending.get(key)
        if pending is not None and pending.exception() is None:  # waits for the prefetch, which cached it
            with self._lock:
                self._unread.discard(key)
            return pending.result(), True
        fetched = fetch()
        with self._lock:
            if key not in self._entries:
                self._put(key, fetched)
        return fetched, True

    def _put(self, key: str, data: pa.Buffer) -> None:
        """Add an entry, dropping the least recently used past the capacity (the newest always stays); under the
        lock."""
        self._entries[key] = data
        self._bytes += data.size
        while self._bytes > self.capacity_bytes and len(self._entries) > 1:
            dropped_key, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.size
            self._unread.discard(dropped_key)


class RemoteSegments:
    """The RemoteSegment of each uploaded segment, made once per process-lifetime of the owner, so that what a
    segment learnt (its indexes, the CRCs it checked) outlives a re-read of the manifest that lists it."""

    def __init__(self, objects: ObjectStore, cache: FetchCache) -> None:
        self.objects, self.cache = objects, cache
        self._made: dict[str, RemoteSegment] = {}

    def of(self, infos: tuple[RemoteSegmentInfo, ...]) -> list[RemoteSegment]:
        segments = []
        for info in infos:
            segment = self._made.get(info.stem)
            if segment is None:
                segment = self._made[info.stem] = RemoteSegment(self.objects, info, self.cache)
            segments.append(segment)
        return segments


class RemoteSegment(SegmentReads):
    def __init__(self, objects: ObjectStore, info: RemoteSegmentInfo, cache: FetchCache) -> None:
        super().__init__()
        self.objects, self.info, self.cache = objects, info, cache
        self.base_offset, self.next_offset, self.size_bytes = info.base_offset, info.next_offset, info.size_bytes
        self.first_timestamp, self.max_timestamp = info.first_timestamp, info.max_timestamp
        self.offset_shift = info.offset_shift
        self._indexes: tuple[OffsetIndex, TimeIndex] | None = None

    @property
    def source(self) -> str:
        return self.objects.url(self.info.log_key)

    def written_ms(self) -> int:
        return self.max_timestamp  # an uploaded segment is never empty, so it has timestamps

    def prefetch(self) -> None:
        self.cache.prefetch(self.info.log_key, lambda: self.objects.read(self.info.log_key))

    def buffer(self) -> pa.Buffer:
        key = self.info.log_key
        data, fetched = self.cache.get(key, lambda: self.objects.read(key))
        if fetched:
            self.forget_verified()  # check the CRCs of every fetch, not only the first
        if data.size != self.size_bytes:
            raise CorruptSegmentError(self.source, min(data.size, self.size_bytes), self.base_offset,
                                      f"the object holds {data.size} bytes, the remote log's manifest says "
                                      f"{self.size_bytes}")
        return data

    def _load_indexes(self) -> tuple[OffsetIndex, TimeIndex]:
        if self._indexes is None:
            offset_key, time_key = self.info.offset_index_key, self.info.time_index_key
            offset_index, time_index = OffsetIndex(Path(offset_key)), TimeIndex(Path(time_key))
            # An index that does not parse, or that the tier no longer holds, only costs speed: a scan then starts
            # at the segment's first batch.
            if not (offset_index.load_bytes(self._index_bytes(offset_key))
                    and offset_index.is_consistent(self.size_bytes)):
                offset_index.keys, offset_index.values = [], []
            if not (time_index.load_bytes(self._index_bytes(time_key))
                    and time_index.is_consistent(self.next_offset - self.base_offset)):
                time_index.keys, time_index.values = [], []
            self._indexes = offset_index, time_index
        return self._indexes

    def _index_bytes(self, key: str) -> bytes:
        """The index object's bytes; none if the tier no longer holds it (reads then scan from the first batch)."""
        try:
            data: bytes = self.objects.read(key).to_pybytes()
        except RemoteObjectMissingError:
            return b""
        return data

    @property
    def offset_index(self) -> OffsetIndex:  # type: ignore[override]  # fetched on first use, not at listing
        return self._load_indexes()[0]

    @property
    def time_index(self) -> TimeIndex:  # type: ignore[override]
        return self._load_indexes()[1]
