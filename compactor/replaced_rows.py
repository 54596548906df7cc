"""A layered run's lower layers: the current view's ledgers, each with the rows the new messages replace marked.

A layered run's phase one reads only the new messages (compactor/run.py); the view's rows are not aggregated with
them again. A row of the view is replaced when the new messages hold its key at all, live or as a tombstone: every
new offset is above the view's horizon, so the new message is the later one. So each run of phase one hands over
the keys it finished (``LiveKeys``: survivors and tombstones), and a pass over the view's ledgers marks the rows
whose key is among them: a membership test of the view's keys against the new keys, not a hash aggregation of
both. Phase one usually finishes in one run, so the view's keys are read once; a budget that splits it into runs
reads them once a run. Rows marked by an earlier run stay marked, and keyless rows are marked too unless
compaction.retain.null.key keeps them (it may have been turned off since they were kept).

Memory: the view's deletion flags (a byte a row), a group of the view's keys with their codes and flags (about
1/MARK_GROUP_SHARE of the budget, or one ledger batch when that is larger), and the hash set Arrow builds of the
run's keys, beside the run phase one hands over.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from compactor.key_codes import KeyCoding, KeysRefused
from compactor.latest_offsets import LiveKeys
from storage.compacted import CompactionCursor
from storage.ledger import Ledger, LedgerReads
from storage.ledger_layers import LayeredLedger, LowerLayer
from storage.schema import STORED_SCHEMA

KEY_COLUMN = STORED_SCHEMA.get_field_index("key")
MARK_GROUP_SHARE = 8
MARK_BYTES_PER_ROW = 16
"""A view's keys are tested a group of rows at a time, as large as 1/MARK_GROUP_SHARE of compaction.memory.bytes
holds, counting each row's key bytes twice (the keys, and the copy their coding makes) and MARK_BYTES_PER_ROW more
(its code and flag; a review measured about 45 bytes a row held for 16-byte keys, 78 for 36-byte keys, which this
counts as 56 and 96). Arrow builds the new keys' hash set again at every call (against 300k keys, 111 calls of
5,000 keys each took about 40 times as long as one call for all of them), so the fewer groups the better: at the
default budget, about 800k rows of the bench's 9-byte keys a group."""


class ReplacedRows:
    """The current view's ledgers, bottom first, and the rows of each that the new messages replace so far."""

    def __init__(self, cursor: CompactionCursor, view: LedgerReads, *, retain_null_key: bool,
                 memory_budget_bytes: int) -> None:
        if isinstance(view, LayeredLedger):
            layers = [(layer.ledger_id, layer.horizon, ledger, layer.deleted.copy()) for layer, ledger in view.lower]
            layers.append((cursor.ledger_id, cursor.horizon, view.top, np.zeros(view.top.messages, bool)))
        else:
            assert isinstance(view, Ledger)
            layers = [(cursor.ledger_id, cursor.horizon, view, np.zeros(view.messages, bool))]
        self._layers: list[tuple[int, int, Ledger, npt.NDArray[np.bool_]]] = layers
        self._retain_null_key = retain_null_key
        self._marked_keyless = retain_null_key
        self._group_bytes = memory_budget_bytes // MARK_GROUP_SHARE

    def mark(self, keys: LiveKeys) -> None:
        """Mark the rows whose key is one of ``keys`` (the survivors and the tombstones of one run of phase one)."""
        codes = pa.concat_arrays([keys.codes, keys.tombstones])
        if len(codes):
            self._pass(_NewKeys(keys.coding, codes))

    def lower_layers(self) -> list[LowerLayer]:
        """The layers beneath the new top, as its layer record names them."""
        if not self._marked_keyless:
            self._pass(None)
        return [LowerLayer(ledger_id, horizon, deleted) for ledger_id, horizon, _, deleted in self._layers]

    def _pass(self, new_keys: _NewKeys | None) -> None:
        """One read of every ledger's keys: mark those among ``new_keys`` and, unless kept, the keyless rows."""
        for _, _, ledger, deleted in self._layers:
            for row, keys in _key_groups(ledger, self._group_bytes):
                mine = deleted[row : row + len(keys)]
                keyed = keys.is_valid().to_numpy(zero_copy_only=False) if keys.null_count else None
                if new_keys is not None:
                    if keyed is None:
                        mine |= new_keys.among(keys)
                    else:
                        mine[keyed] |= new_keys.among(keys.filter(pa.array(keyed)))
                if keyed is not None and not self._retain_null_key:
                    mine |= ~keyed
        self._marked_keyless = True


class _NewKeys:
    """One run's keys, which a view's keys are tested against as codes of the run's coding; as bytes where some
    key does not take the coding (another length: it is none of the new keys, but the coding refuses it)."""

    def __init__(self, coding: KeyCoding, codes: pa.Array) -> None:
        self.coding = coding
        self._codes = codes
        self._as_codes = pc.SetLookupOptions(value_set=codes)
        self._as_bytes: pc.SetLookupOptions | None = None

    def among(self, keys: pa.Array) -> npt.NDArray[np.bool_]:
        """Whether each of ``keys`` (none null) is one of the new keys."""
        try:
            hits = pc.is_in(self.coding.encode(keys), options=self._as_codes)
        except KeysRefused:
            if self._as_bytes is None:
                self._as_bytes = pc.SetLookupOptions(value_set=self.coding.decode(self._codes))
            hits = pc.is_in(keys, options=self._as_bytes)
        among: npt.NDArray[np.bool_] = hits.to_numpy(zero_copy_only=False)
        return among


def _key_groups(ledger: Ledger, group_bytes: int) -> Iterator[tuple[int, pa.Array]]:
    """The ledger's keys, about ``group_bytes`` at a time (see MARK_BYTES_PER_ROW; a batch at least), each group
    with the number of its first row."""
    first = held = 0
    chunks: list[pa.Array] = []
    for row, batch in ledger.read_numbered_batches():
        if not chunks:
            first = row
        keys = batch.column(KEY_COLUMN)
        chunks.append(keys)
        held += 2 * keys.nbytes + MARK_BYTES_PER_ROW * len(keys)
        if held >= group_bytes:
            yield first, pa.concat_arrays(chunks)
            chunks, held = [], 0
    if chunks:
        yield first, pa.concat_arrays(chunks)
