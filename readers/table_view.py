"""TableView: the latest value of every key of a topic, for point lookups (Pulsar's TableView, Kafka's KTable).

Each partition is a PartitionTable (readers/partition_table.py): the compacted ledger, looked up through its key
index, plus the raw tail above the horizon. Every public method refreshes first, so the view follows appends and
compactions made by other processes; a refresh is cheap when nothing changed.

A key normally lives in one partition (the partitioner sends a key to one place). If producers put one key into
several partitions, each partition keeps its own latest value (a tombstone removes the key from its partition
only) and the view shows the live value with the latest timestamp, the higher partition on a tie.
"""

from __future__ import annotations

from types import TracebackType

from readers.errors import ReaderClosedError
from readers.partition_table import PartitionTable
from readers.topic_read import StoreOrPath, open_store


class TableView:
    """Latest value per key of ``topic``. ``store``: a Store (left open) or a data folder's path (opened here,
    closed by ``close``). Keys are bytes; str keys are encoded as UTF-8."""

    def __init__(self, store: StoreOrPath, topic: str) -> None:
        self._store, self._owns_store = open_store(store)
        self.topic = topic
        self._tables: list[PartitionTable] = []
        self._closed = False
        try:
            partitions = self._store.topic_metadata(topic).partitions
            self._tables = [PartitionTable(self._store, topic, partition) for partition in range(partitions)]
            self.refresh()
        except BaseException:
            self.close()
            raise

    def refresh(self) -> None:
        """Catch up with new raw messages and a newly published compaction."""
        if self._closed:
            raise ReaderClosedError("TableView")
        for table in self._tables:
            table.refresh()

    def get(self, key: bytes | str) -> bytes | None:
        """The key's latest value, or None if it has none or was tombstoned."""
        self.refresh()
        wanted = _as_key(key)
        found = [(hit[0], table.partition, hit[1]) for table in self._tables
                 if (hit := table.get(wanted)) is not None]
        return max(found)[2] if found else None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (bytes, str)) and self.get(key) is not None

    def keys(self) -> list[bytes]:
        """Every key with a live value, at the time of the call."""
        self.refresh()
        if len(self._tables) == 1:
            return self._tables[0].live_keys()
        return list(dict.fromkeys(key for table in self._tables for key in table.live_keys()))

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every (key, latest value), at the time of the call."""
        self.refresh()
        if len(self._tables) == 1:
            return [(key, value) for key, _, value in self._tables[0].live_items()]
        latest: dict[bytes, tuple[int, int, bytes]] = {}
        for table in self._tables:
            for key, timestamp, value in table.live_items():
                candidate = (timestamp, table.partition, value)
                known = latest.get(key)
                if known is None or candidate[:2] > known[:2]:
                    latest[key] = candidate
        return [(key, value) for key, (_, _, value) in latest.items()]

    def __len__(self) -> int:
        """Live keys; counted without materialising them on a one-partition topic."""
        self.refresh()
        if len(self._tables) == 1:
            return self._tables[0].count()
        return len({key for table in self._tables for key in table.live_keys()})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for table in self._tables:
            table.close()
        if self._owns_store:
            self._store.close()

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _as_key(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)
