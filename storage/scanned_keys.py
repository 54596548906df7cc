"""A ledger's keys read by a scan, for point lookups while its key index is set aside as damaged.

The keys are fingerprinted once (storage/fingerprint.py) and their rows sorted by fingerprint, so a lookup is a
binary search and a comparison of the few rows that share its fingerprint: O(log n) a lookup and 16 bytes a key
beside the keys themselves, where a search of the keys would read them all on every lookup.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from storage.fingerprint import fingerprint_rows, fingerprints


class ScannedKeys:
    def __init__(self, keys: pa.Array, offsets: npt.NDArray[np.int64]) -> None:
        """``keys``: a ledger's keys (binary, no nulls); ``offsets``: their messages' offsets, in the same order."""
        hashes = fingerprints(keys)
        self._order = np.argsort(hashes, kind="stable")
        self._sorted_hashes = hashes[self._order]
        self._keys = keys
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets)

    def offset_of(self, key: bytes) -> int | None:
        """The offset of ``key``'s message; None if the ledger lacks the key."""
        wanted = fingerprint_rows(np.frombuffer(key, np.uint8).reshape(1, -1))[0]  # half of fingerprints' call cost
        lower = int(np.searchsorted(self._sorted_hashes, wanted, side="left"))
        upper = int(np.searchsorted(self._sorted_hashes, wanted, side="right"))
        for row in self._order[lower:upper]:
            if self._keys[int(row)].as_py() == key:
                return int(self._offsets[row])
        return None


def scanned_keys(batches: Iterable[pa.RecordBatch]) -> ScannedKeys:
    """The keyed messages' keys and offsets of a ledger's batches (columns 0 and 2 of STORED_SCHEMA), read one batch
    at a time: only their key and offset columns are kept, not the values."""
    keys: list[pa.Array] = []
    offsets: list[npt.NDArray[np.int64]] = []
    for batch in batches:
        keys.append(batch.column(2))
        offsets.append(batch.column(0).to_numpy())
    if not keys:
        return ScannedKeys(pa.array([], pa.binary()), np.empty(0, np.int64))
    all_keys = pa.concat_arrays(keys)
    keyed = pc.is_valid(all_keys)
    return ScannedKeys(all_keys.filter(keyed), np.concatenate(offsets)[keyed.to_numpy(zero_copy_only=False)])
