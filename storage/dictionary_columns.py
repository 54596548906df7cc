"""Dictionary-encoded key and value columns in compressed batches, and their decoding back to plain ones.

Small rows repeat: price ticks have a few hundred keys and a few thousand prices in a 10,000-message batch, which
zstd over Arrow's plain binary buffers stores in about 4.5 bytes a message per column; as a dictionary and 1- or
2-byte indices they take 1.5 and 3.8 (bench/RESULTS.md, issue 19). Steps for one column of a batch to encode:

1. Batches under ``MIN_ROWS`` messages stay plain: the schema message a dictionary payload carries costs more than
   it saves.
2. A sample of ``SAMPLE_ROWS`` messages spread evenly over the batch in which no value repeats (random keys, ids,
   random values) leaves the column plain without hashing it all.
3. Otherwise the column is dictionary-encoded, and kept so only when its distinct values are at most
   ``DISTINCT_SHARE_MAX`` of its messages (above that the dictionary, stored beside the indices, stops paying).
   Nulls (keyless messages, tombstones) are null indices. The indices take the narrowest signed integer type the
   dictionary fits.

Decoding turns every dictionary column back into its dictionary's values (``take``, bounds-checked) after a full
validation of the dictionary, so a damaged payload is an error, never a read out of bounds.
"""

from __future__ import annotations

import functools
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MIN_ROWS: Final = 1024
"""A dictionary payload starts with a schema message of about 1 kB."""
SAMPLE_ROWS: Final = 256
"""256 draws from 5,000 values (a 10,000-message batch at ``DISTINCT_SHARE_MAX``) repeat one with probability
0.998; from a million keys, with probability 0.03."""
DISTINCT_SHARE_MAX: Final = 0.5
ENCODED_COLUMNS: Final = ("key", "value")


def with_dictionaries(batch: pa.RecordBatch) -> pa.RecordBatch | None:
    """``batch`` (a payload's columns) with its key and value columns dictionary-encoded where that pays; None
    when neither column pays."""
    if batch.num_rows < MIN_ROWS:
        return None
    schema, columns, encoded_any = batch.schema, list(batch.columns), False
    for index in map(schema.get_field_index, ENCODED_COLUMNS):
        encoded = _dictionary_encoded(columns[index])
        if encoded is not None:
            columns[index], encoded_any = encoded, True
            schema = schema.set(index, schema.field(index).with_type(encoded.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema) if encoded_any else None


def _dictionary_encoded(column: pa.Array) -> pa.DictionaryArray | None:
    if len(pc.unique(column.take(_sample_rows(len(column))))) == SAMPLE_ROWS:
        return None
    encoded = pc.dictionary_encode(column)
    distinct = len(encoded.dictionary)
    if not 0 < distinct <= DISTINCT_SHARE_MAX * len(column):
        return None
    index_type = pa.int8() if distinct <= 127 else pa.int16() if distinct <= 32_767 else pa.int32()
    return pa.DictionaryArray.from_arrays(encoded.indices.cast(index_type), encoded.dictionary, safe=False)


@functools.lru_cache(maxsize=64)
def _sample_rows(rows: int) -> pa.Array:
    return pa.array(np.arange(SAMPLE_ROWS) * (rows // SAMPLE_ROWS))


def without_dictionaries(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch of ``schema`` (the payload's plain columns) a dictionary payload's ``batch`` stands for.

    Raises pyarrow's errors: ArrowInvalid for columns that do not decode to ``schema`` or a dictionary that
    fails validation, ArrowIndexError for an index outside its dictionary.
    """
    if batch.schema.names != schema.names:
        raise pa.ArrowInvalid(f"columns {batch.schema.names}, expected {schema.names}")
    columns = [_plain(column) for column in batch.columns]
    for column, field in zip(columns, schema, strict=True):
        if column.type != field.type:
            raise pa.ArrowInvalid(f"column {field.name!r} decodes to {column.type}, expected {field.type}")
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _plain(column: pa.Array) -> pa.Array:
    if not isinstance(column, pa.DictionaryArray):
        return column
    column.dictionary.validate(full=True)
    return column.dictionary_decode()
