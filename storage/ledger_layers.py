"""Layered compacted views: a small ledger of what changed, over the ledgers of earlier runs.

A compaction whose new messages replace few of the view's keys need not copy the whole view again (as Pulsar's
does): it writes only the latest message of each key the new messages touched, as a new ledger, the *top*, and
marks in each older ledger beneath it the rows those keys replace (a deletion vector, as Delta Lake's and
Iceberg's are). A layered view is read bottom layer first, each layer's unmarked rows, then the top: the layers'
offsets never overlap (a layer holds offsets above the horizon of the one beneath it), so that is offset order.

The layers are named by a *layer record* beside the top ledger, ``<ledger id>.layers``: the ledgers beneath it,
bottom first, with their horizons and their deleted rows (every ledger a run publishes has one; a view of one
ledger names none). It never changes: a later layered run writes a record of its own for its own top, so a reader
that opened a view keeps reading that view however many runs follow.
See docs/FORMAT.md, "Layered views".
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from storage.codec import BatchHeader
from storage.errors import CorruptDataError
from storage.fileio import write_durably
from storage.ledger import Ledger
from storage.records import CorruptRecordError, decode_record, encode_record

LAYERS_RECORD = "ledger-layers"
LAYERS_VERSION = 1


class CorruptLayerRecordError(CorruptDataError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"Layer record {path} is unreadable: {reason}. The compacted view it names cannot be read; "
                         "rebuild it from the raw log with `ledgerview verify --repair`, which works while retention "
                         "has not removed the raw messages the view covers.")


@dataclass(frozen=True)
class LowerLayer:
    """A ledger beneath the top of a layered view, and which of its rows the layers above it replace."""

    ledger_id: int
    horizon: int
    deleted: npt.NDArray[np.bool_]
    """One flag per row of the ledger, in its order: True where a later message of the key replaces the row."""


def write_layer_record(path: Path, lower: list[LowerLayer]) -> None:
    """Write (durably) the layer record of a new top ledger; it must be done before a cursor names the top."""
    body = {"lower": [{"ledger_id": layer.ledger_id, "horizon": layer.horizon, "rows": len(layer.deleted),
                       "deleted": base64.b64encode(np.packbits(layer.deleted, bitorder="little").tobytes()).decode()}
                      for layer in lower]}
    write_durably(path, encode_record(LAYERS_RECORD, LAYERS_VERSION, body), exclusive=True)


def read_layer_record(path: Path) -> list[LowerLayer]:
    """The lower layers a layer record names; raises FileNotFoundError if there is none."""
    data = path.read_bytes()
    try:
        _, body = decode_record(path, data, LAYERS_RECORD, max_version=LAYERS_VERSION)
        layers = []
        for entry in body["lower"]:
            rows = int(entry["rows"])
            packed = np.frombuffer(base64.b64decode(entry["deleted"], validate=True), np.uint8)
            if len(packed) != (rows + 7) // 8:
                raise ValueError(f"ledger {entry['ledger_id']}'s deleted rows hold {len(packed)} bytes for {rows} rows")
            deleted = np.unpackbits(packed, count=rows, bitorder="little").astype(bool)
            layers.append(LowerLayer(int(entry["ledger_id"]), int(entry["horizon"]), deleted))
        return layers
    except CorruptRecordError as error:
        raise CorruptLayerRecordError(path, error.reason) from error
    except (ValueError, TypeError, KeyError) as error:
        raise CorruptLayerRecordError(path, str(error)) from error


class LayeredLedger:
    """A layered view opened for reading, with the methods of a single ``Ledger`` (storage/ledger.LedgerReads)."""

    def __init__(self, lower: list[tuple[LowerLayer, Ledger]], top: Ledger, *, record: Path) -> None:
        """``record``: where the layers were read from, for errors. Takes the ledgers' ownership, even on error."""
        for layer, ledger in lower:
            if len(layer.deleted) != sum(header.record_count for header in ledger.headers):
                for _, opened in lower:
                    opened.close()
                top.close()
                raise CorruptLayerRecordError(record, f"it counts {len(layer.deleted)} rows in ledger "
                                              f"{ledger.source}, which holds a different number")
        self.lower = lower
        self.top = top
        self.source = top.source
        self.headers: list[BatchHeader] = [header for _, ledger in lower for header in ledger.headers] + top.headers

    @property
    def messages(self) -> int:
        """Live messages: what the view serves."""
        return sum(ledger.messages - int(layer.deleted.sum()) for layer, ledger in self.lower) + self.top.messages

    @property
    def size_bytes(self) -> int:
        return sum(ledger.size_bytes for _, ledger in self.lower) + self.top.size_bytes

    def read_batches(self, start_offset: int = 0, end_offset: int | None = None) -> Iterator[pa.RecordBatch]:
        """The view's live messages with start_offset <= offset < end_offset, in offset order."""
        for layer, ledger in self.lower:
            for row, batch in ledger.read_numbered_batches(start_offset, end_offset):
                deleted = layer.deleted[row : row + batch.num_rows]
                if not deleted.any():
                    yield batch
                elif not deleted.all():
                    yield batch.filter(pa.array(~deleted))
        yield from self.top.read_batches(start_offset, end_offset)

    def lookup(self, key: bytes) -> pa.RecordBatch | None:
        """The one-row batch holding ``key``'s message, looked up from the top layer down. A hit on a deleted row
        means the key's latest message is a tombstone: a live later one would have been found in a layer above."""
        found = self.top.lookup(key)
        if found is not None:
            return found
        for layer, ledger in reversed(self.lower):
            hit = ledger.lookup_row(key)
            if hit is not None:
                row, batch = hit
                return None if layer.deleted[row] else batch
        return None

    @property
    def key_indexed(self) -> bool:
        return self.top.key_indexed and all(ledger.key_indexed for _, ledger in self.lower)

    def offset_of(self, key: bytes) -> int | None:
        found = self.lookup(key)
        return None if found is None else int(found.column(0)[0].as_py())

    def close(self) -> None:
        for _, ledger in self.lower:
            ledger.close()
        self.top.close()
