"""Buckets written to disk when reducing them no longer frees enough memory (a Grace hash aggregation's spill):
each spill is one Arrow IPC file with one record batch per bucket, read back memory-mapped, a bucket at a time,
when phase one finishes that bucket."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from compactor.buckets import HeldBuckets, Pairs


class SpilledBuckets:
    def __init__(self, folder: Path, code_type: pa.DataType) -> None:
        self._folder = folder
        self._schema = pa.schema([("key", code_type), ("number", pa.int64())])
        self._readers: list[pa.ipc.RecordBatchFileReader] = []

    @property
    def spills(self) -> int:
        return len(self._readers)

    def write(self, held: HeldBuckets) -> None:
        """Write every bucket ``held`` holds (each reduced to one pair per key beforehand) as the next spill."""
        path = self._folder / f"spill-{len(self._readers)}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, self._schema) as writer:
            for parts in held:
                codes = pa.concat_arrays([codes for codes, _ in parts]) if parts else pa.array([], self._schema[0].type)
                numbers = pa.concat_arrays([pa.array(numbers) for _, numbers in parts]) if parts else pa.array(
                    [], pa.int64())
                writer.write_batch(pa.record_batch([codes, numbers], schema=self._schema))
        self._readers.append(pa.ipc.open_file(pa.memory_map(str(path))))

    def parts(self, bucket: int) -> list[Pairs]:
        """The bucket's pairs from every spill (each one pair per key)."""
        parts = []
        for reader in self._readers:
            batch = reader.get_batch(bucket)
            if batch.num_rows:
                parts.append((batch.column(0), batch.column(1).to_numpy()))
        return parts
