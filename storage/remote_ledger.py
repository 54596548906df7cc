"""A partition's compacted view on the remote tier: its ledger and flat key index as objects, named by the remote
log's manifest (storage/remote_log.py) in the same create-once publish that fences stale writers.

``RemoteCompactedView`` is what the manifest holds: the ledger's identity and horizon (as the local compaction
cursor has them), the keys of its objects (the ledger and its key index, each in one object or, as Spark's tasks
write them, in pieces), and the header of every ledger batch, so a reader finds the batch that holds an offset, or
a key's offset, without reading the ledger. ``RemoteLedger`` reads such a ledger with the
methods of a local one (storage/ledger.py): each batch is one ranged read, kept in the tier's fetch cache.
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, replace
from typing import Any

import pyarrow as pa

from storage.codec import BatchHeader
from storage.compacted import CompactionCursor
from storage.dropped_tombstones import Ranges, check, of_record
from storage.errors import CorruptDataError, CorruptRemoteLedgerError
from storage.ledger import Ledger
from storage.object_store import ObjectStore
from storage.remote_key_index import FlatKeyIndex, FlatKeyIndexes, RangeReader
from storage.remote_segment import FetchCache


class RemoteViewMismatchError(CorruptDataError):
    """A compacted view on the remote tier whose counts disagree with its batches (``RemoteCompactedView.mismatch``):
    served as it is, it would miss or repeat messages. The remote-tier twin of the local ViewMismatchError."""

    def __init__(self, manifest_url: str, reason: str) -> None:
        super().__init__(f"The compacted view that {manifest_url} names does not match its ledger: {reason}. Its "
                         "writer published a view it does not hold, so readers of the remote tier get no compacted "
                         "view of this partition (its raw log is read as before) until a compaction publishes a new "
                         "one.")


@dataclass(frozen=True)
class KeyIndexPiece:
    """One flat key index object: it holds the ledger's keys from ``first_key`` (bytewise) to the next piece's."""

    key: str
    size_bytes: int
    first_key: bytes


@dataclass(frozen=True)
class RemoteCompactedView:
    ledger_id: int
    horizon: int
    """The last raw offset the ledger covers."""
    messages_read: int
    messages_kept: int
    ledger_keys: tuple[str, ...]
    """Keys of the ledger's objects, relative to the remote URI, in offset order: one for a ledger compacted in
    one process, one per phase-two task for a ledger Spark wrote (streaming/compaction.py)."""
    ledger_bytes: int
    key_indexes: tuple[KeyIndexPiece, ...]
    """The key index's objects in key order; their key ranges do not overlap."""
    published_ms: int
    batches: tuple[tuple[int, ...], ...]
    """Each ledger batch's header fields in BatchHeader's order, then the index in ``ledger_keys`` of its object."""
    dropped_tombstones: Ranges = ()
    """As the local cursor's (storage/compacted.py): where the tombstones compactions left out lie."""

    def __post_init__(self) -> None:
        check(self.dropped_tombstones, self.horizon)

    @property
    def object_sizes(self) -> list[tuple[str, int]]:
        """Every object the view names, with its size."""
        pieces = [0] * len(self.ledger_keys)
        for batch in self.batches:
            pieces[batch[-1]] += batch[1]
        return [*zip(self.ledger_keys, pieces, strict=True),
                *((piece.key, piece.size_bytes) for piece in self.key_indexes)]

    @property
    def object_keys(self) -> tuple[str, ...]:
        return (*self.ledger_keys, *(piece.key for piece in self.key_indexes))

    def mismatch(self) -> str | None:
        """Why the view disagrees with its batch headers (they are in the manifest, so this costs no request), or
        None: the messages it says it serves and its bytes are its batches', no batch lies above its horizon, each
        lies in one of its ledger objects, and a view with batches has a key index to look keys up in."""
        headers = [BatchHeader(*fields[:-1]) for fields in self.batches]
        messages = sum(header.record_count for header in headers)
        if messages != self.messages_kept:
            return f"it says the view serves {self.messages_kept} messages, its batches hold {messages}"
        size = sum(header.batch_length for header in headers)
        if size != self.ledger_bytes:
            return f"it says the ledger holds {self.ledger_bytes} bytes, its batches take {size}"
        if headers and headers[-1].last_offset > self.horizon:
            return f"its last batch holds offset {headers[-1].last_offset}, above its horizon {self.horizon}"
        if any(not 0 <= fields[-1] < len(self.ledger_keys) for fields in self.batches):
            return f"a batch lies in none of its {len(self.ledger_keys)} ledger objects"
        if headers and not self.key_indexes:
            return "it has batches but no key index"
        return None

    def cursor(self) -> CompactionCursor:
        """The view as a local compaction cursor says it (readers plan on that)."""
        return CompactionCursor(self.ledger_id, self.horizon, self.messages_read, self.messages_kept,
                                self.ledger_bytes, self.published_ms,
                                dropped_tombstones=self.dropped_tombstones)

    def to_record(self) -> dict[str, Any]:
        return {**asdict(self), "ledger_keys": list(self.ledger_keys), "batches": [list(b) for b in self.batches],
                "key_indexes": [[piece.key, piece.size_bytes, piece.first_key.hex()] for piece in self.key_indexes]}

    @classmethod
    def from_record(cls, body: dict[str, Any]) -> RemoteCompactedView:
        """The view of a manifest record; one of version 1 (a single ledger and key index object) is read too."""
        if "ledger_key" in body:
            body = {**body, "ledger_keys": [body.pop("ledger_key")], "batches": [[*b, 0] for b in body["batches"]],
                    "key_indexes": [[body.pop("key_index_key"), body.pop("key_index_bytes"), ""]]}
        return cls(**{**body, "ledger_keys": tuple(body["ledger_keys"]),
                      "batches": tuple(tuple(batch) for batch in body["batches"]),
                      "dropped_tombstones": of_record(body.get("dropped_tombstones"), body["horizon"]),
                      "key_indexes": tuple(KeyIndexPiece(key, size, bytes.fromhex(first))
                                           for key, size, first in body["key_indexes"])})

    @classmethod
    def of(cls, cursor: CompactionCursor, ledger: Ledger, *, ledger_key: str, key_index_key: str,
           key_index_bytes: int) -> RemoteCompactedView:
        """The view of a ledger compacted in one process and uploaded as one object with one key index."""
        return cls(cursor.ledger_id, cursor.horizon, cursor.messages_read, cursor.messages_kept, (ledger_key,),
                   ledger.size_bytes, (KeyIndexPiece(key_index_key, key_index_bytes, b""),), cursor.published_ms,
                   tuple((*astuple(header), 0) for header in ledger.headers), cursor.dropped_tombstones)


class RemoteLedger(Ledger):
    """A ledger read from the remote tier: batch by batch through ranged reads, lookups through its flat index.
    Raises RemoteViewMismatchError if the view's counts disagree with its batches, as the local view is checked
    against its cursor on open (CompactedLedgers._check_view); ``manifest_url`` names the manifest that holds it."""

    corrupt_batch_error = CorruptRemoteLedgerError

    def __init__(self, objects: ObjectStore, view: RemoteCompactedView, cache: FetchCache, *, manifest_url: str,
                 verify: bool = True) -> None:
        reason = view.mismatch()
        if reason is not None:
            raise RemoteViewMismatchError(manifest_url, reason)
        self.objects, self.view, self.cache = objects, view, cache
        keys = FlatKeyIndexes([(piece.first_key, FlatKeyIndex(objects.url(piece.key), piece.size_bytes,
                                                              self._range_reader(piece.key)))
                               for piece in view.key_indexes])
        self._object_of = {batch[0]: view.ledger_keys[batch[-1]] for batch in view.batches}
        source = (objects.url(view.ledger_keys[0]) if len(view.ledger_keys) == 1
                  else f"ledger {view.ledger_id} in {len(view.ledger_keys)} objects at {objects.uri}")
        self._set_up(source, [BatchHeader(*fields[:-1]) for fields in view.batches], keys, verify=verify)

    def _range_reader(self, key: str) -> RangeReader:
        return lambda position, length: self._fetch(key, position, length)[0]

    def _fetch(self, key: str, position: int, length: int) -> tuple[pa.Buffer, bool]:
        return self.cache.get(f"{key}@{position}+{length}", lambda: self.objects.read_range(key, position, length))

    def _batch_bytes(self, header: BatchHeader) -> tuple[pa.Buffer, BatchHeader]:
        """The batch, in one ranged read; CorruptLedgerError if its object ends inside it (cut short)."""
        key = self._object_of[header.base_offset]
        buffer, fetched = self._fetch(key, header.position, header.batch_length)
        if buffer.size != header.batch_length:
            raise CorruptRemoteLedgerError(self.objects.url(key), header.position, header.base_offset,
                                     f"the object holds {buffer.size} of the batch's {header.batch_length} bytes "
                                     "there: it is cut short")
        if fetched:
            self._verified.discard(header.position)  # check the CRC of every fetch
        return buffer, replace(header, position=0)
