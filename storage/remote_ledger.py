"""A partition's compacted view on the remote tier: its ledger and flat key index as objects, named by the remote
log's manifest (storage/remote_log.py) in the same create-once publish that fences stale writers.

``RemoteCompactedView`` is what the manifest holds: the ledger's identity and horizon (as the local compaction
cursor has them), the keys of its two objects, and the header of every ledger batch, so a reader finds the batch
that holds an offset, or a key's offset, without reading the ledger. ``RemoteLedger`` reads such a ledger with the
methods of a local one (storage/ledger.py): each batch is one ranged read, kept in the tier's fetch cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow as pa

from storage.codec import BatchHeader
from storage.compacted import CompactionCursor
from storage.ledger import Ledger
from storage.object_store import ObjectStore
from storage.remote_key_index import FlatKeyIndex
from storage.remote_segment import FetchCache


@dataclass(frozen=True)
class RemoteCompactedView:
    ledger_id: int
    horizon: int
    """The last raw offset the ledger covers."""
    messages_read: int
    messages_kept: int
    ledger_key: str
    """Key of the ledger object, relative to the remote URI."""
    ledger_bytes: int
    key_index_key: str
    key_index_bytes: int
    published_ms: int
    batches: tuple[tuple[int, ...], ...]
    """Each ledger batch's header fields, in BatchHeader's order."""

    @property
    def object_keys(self) -> tuple[str, str]:
        return self.ledger_key, self.key_index_key

    def cursor(self) -> CompactionCursor:
        """The view as a local compaction cursor says it (readers plan on that)."""
        return CompactionCursor(self.ledger_id, self.horizon, self.messages_read, self.messages_kept,
                                self.ledger_bytes, self.published_ms)

    def to_record(self) -> dict[str, Any]:
        return {**asdict(self), "batches": [list(batch) for batch in self.batches]}

    @classmethod
    def from_record(cls, body: dict[str, Any]) -> RemoteCompactedView:
        return cls(**{**body, "batches": tuple(tuple(batch) for batch in body["batches"])})

    @classmethod
    def of(cls, cursor: CompactionCursor, ledger: Ledger, *, ledger_key: str, key_index_key: str,
           key_index_bytes: int) -> RemoteCompactedView:
        return cls(cursor.ledger_id, cursor.horizon, cursor.messages_read, cursor.messages_kept, ledger_key,
                   ledger.size_bytes, key_index_key, key_index_bytes, cursor.published_ms,
                   tuple(tuple(asdict(header).values()) for header in ledger.headers))


class RemoteLedger(Ledger):
    """A ledger read from the remote tier: batch by batch through ranged reads, lookups through its flat index."""

    def __init__(self, objects: ObjectStore, view: RemoteCompactedView, cache: FetchCache, *,
                 verify: bool = True) -> None:
        self.objects, self.view, self.cache = objects, view, cache
        keys = FlatKeyIndex(objects.url(view.key_index_key), view.key_index_bytes,
                            lambda position, length: self._fetch(view.key_index_key, position, length)[0])
        self._set_up(objects.url(view.ledger_key), [BatchHeader(*fields) for fields in view.batches], keys,
                     verify=verify)

    def _fetch(self, key: str, position: int, length: int) -> tuple[pa.Buffer, bool]:
        return self.cache.get(f"{key}@{position}+{length}", lambda: self.objects.read_range(key, position, length))

    def _batch_bytes(self, header: BatchHeader) -> tuple[pa.Buffer, BatchHeader]:
        buffer, fetched = self._fetch(self.view.ledger_key, header.position, header.batch_length)
        if fetched:
            self._verified.discard(header.position)  # check the CRC of every fetch
        return buffer, replace(header, position=0)
