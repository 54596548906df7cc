"""Small columnar helpers shared by the readers: no per-message Python on these paths."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc


def first_offset_at_or_after(batches: Iterable[pa.RecordBatch], timestamp_ms: int) -> int | None:
    """Offset of the first message (in batch order) whose timestamp is >= ``timestamp_ms``; None if none.

    Works on STORED_SCHEMA and MESSAGE_SCHEMA batches alike (columns by name); one vectorised compare per batch.
    """
    for batch in batches:
        reached = pc.greater_equal(batch.column("timestamp"), pa.scalar(timestamp_ms, pa.int64()))
        first = pc.index(reached, True).as_py()
        if first >= 0:
            return int(batch.column("offset")[first].as_py())
    return None


def take_rows(batch: pa.RecordBatch, max_rows: int | None) -> pa.RecordBatch:
    """At most ``max_rows`` leading rows (zero-copy slice); the batch itself when it fits."""
    if max_rows is None or batch.num_rows <= max_rows:
        return batch
    return batch.slice(0, max_rows)
