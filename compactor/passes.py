"""What a phase-one pass reads: its part of the keys, and (code, number) pieces of its keyed messages, from the
input batches (compactor/latest_offsets.py) or from the spill files (compactor/spill.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.key_codes import KeyCoding


@dataclass(frozen=True)
class Part:
    """The keys of one pass: those whose hash mod ``modulus`` is ``residue``."""

    modulus: int
    residue: int

    def split(self, ways: int) -> list[Part]:
        return [Part(self.modulus * ways, self.residue + self.modulus * j) for j in range(ways)]


class CodingChanged(Exception):
    """A batch's keys do not fit the coding chosen from the first batch."""


def keyed_numbers(batch: pa.RecordBatch) -> tuple[pa.Array, npt.NDArray[np.int64]]:
    """The keys of the keyed messages of a batch and their numbers 2 * offset + (1 if the value is not null)."""
    keys = batch.column(2)
    codes = batch.column(0).to_numpy() * 2 + batch.column(3).is_valid().to_numpy(zero_copy_only=False)
    if keys.null_count:
        keyed = keys.is_valid()
        return keys.filter(keyed), codes[keyed.to_numpy(zero_copy_only=False)]
    return keys, codes


@dataclass
class Scan:
    """How far a pass has read: messages, and keyed messages (all of them, not only the pass's own)."""

    messages: int = 0
    keyed: int = 0


Pieces = Iterator[tuple[pa.Array, np.ndarray]]


def from_batches(batches: Iterable[pa.RecordBatch], coding: KeyCoding, part: Part, hashes: np.ndarray | None,
                  scan: Scan) -> Pieces:
    """(codes, numbers) of the pass's keyed messages, batch by batch from the input."""
    for batch in batches:
        scan.messages += batch.num_rows
        keys, numbers = keyed_numbers(batch)
        if not coding.accepts(keys):
            raise CodingChanged()
        codes = coding.encode(keys)
        if hashes is not None and part.modulus > 1:
            mine = hashes[scan.keyed : scan.keyed + len(keys)] % np.uint64(part.modulus) == part.residue
            codes, numbers = codes.filter(pa.array(mine)), numbers[mine]
        scan.keyed += len(keys)
        yield codes, numbers
