"""The commit reads a staged file as runs of one target partition each (streaming/sink_commit.py
``read_staged``): rows in their staged order, an empty record batch in the file read as no rows, not an error."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from streaming.sink_commit import read_staged

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32())])


def test_staged_rows_come_back_per_partition_in_order_and_an_empty_batch_adds_none(tmp_path: Path) -> None:
    batches = [
        pa.record_batch([[b"a", b"b"], [b"1", b"2"], [1, 1]], schema=SCHEMA),
        pa.record_batch([[], [], []], schema=SCHEMA),
        pa.record_batch([[b"c", b"d", b"e"], [b"3", b"4", b"5"], [0, 1, 0]], schema=SCHEMA),
    ]
    with pa.OSFile(str(tmp_path / "staged.arrow"), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        for batch in batches:
            writer.write_batch(batch)
    runs = read_staged(tmp_path, ["staged.arrow"])
    assert {partition: table.to_pydict() for partition, table in runs.items()} == {
        0: {"key": [b"c", b"e"], "value": [b"3", b"5"]},
        1: {"key": [b"a", b"b", b"d"], "value": [b"1", b"2", b"4"]},
    }
