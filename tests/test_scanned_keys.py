"""storage/scanned_keys.py: the lookups a ledger answers from a scan while its key index is set aside."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from storage.scanned_keys import scanned_keys
from storage.schema import STORED_SCHEMA


def ledger_batch(keys: Sequence[bytes | None], first_offset: int) -> pa.RecordBatch:
    rows = len(keys)
    return pa.RecordBatch.from_arrays([
        pa.array(np.arange(first_offset, first_offset + 2 * rows, 2, dtype=np.int64)),
        pa.array(np.zeros(rows, np.int64)).cast(STORED_SCHEMA.field(1).type),
        pa.array(keys, pa.binary()),
        pa.array([b"v"] * rows, pa.binary()),
        pa.nulls(rows, STORED_SCHEMA.field(4).type),
    ], schema=STORED_SCHEMA)


def test_every_key_finds_its_offset_across_batches_and_absent_ones_none() -> None:
    keys = [b"k%06d" % number for number in range(20_000)]
    found = scanned_keys([ledger_batch(keys[:7_000], 0), ledger_batch(keys[7_000:], 100_000)])
    assert len(found) == 20_000
    assert [found.offset_of(key) for key in keys[:3]] == [0, 2, 4]
    assert found.offset_of(keys[7_000]) == 100_000
    assert found.offset_of(keys[-1]) == 100_000 + 2 * (20_000 - 7_000 - 1)
    assert all(found.offset_of(b"k%06d" % number) is None for number in range(20_000, 20_100))


def test_keyless_messages_are_not_keys_and_the_empty_key_is_one() -> None:
    found = scanned_keys([ledger_batch([None, b"", None, b"a"], 10)])
    assert len(found) == 2
    assert found.offset_of(b"") == 12
    assert found.offset_of(b"a") == 16
    assert found.offset_of(b"b") is None


def test_an_empty_ledger_has_no_keys() -> None:
    assert scanned_keys([]).offset_of(b"a") is None
