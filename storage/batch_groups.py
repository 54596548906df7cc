"""Consecutive record batches taken a group at a time: work done per group pays its fixed costs (numpy and Arrow
calls, a group-by) once per many messages rather than once per stored batch (often a few thousand messages)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa


def grouped(batches: Iterable[pa.RecordBatch], messages: int) -> Iterator[list[pa.RecordBatch]]:
    """Consecutive batches, in lists of about ``messages`` messages (a bigger batch alone)."""
    group: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        group.append(batch)
        held += batch.num_rows
        if held >= messages:
            yield group
            group, held = [], 0
    if group:
        yield group
