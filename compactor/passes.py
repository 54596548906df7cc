"""What a phase-one pass reads: its part of the keys, and (code, number) pieces of its keyed messages, from the
input batches (compactor/latest_offsets.py) or from the spill files (compactor/spill.py), cut into the pieces the
aggregation takes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.key_codes import KeyCoding
from storage.batch_groups import grouped


@dataclass(frozen=True)
class Part:
    """The keys of one pass: those whose hash mod ``modulus`` is ``residue``."""

    modulus: int
    residue: int

    def split(self, ways: int) -> list[Part]:
        return [Part(self.modulus * ways, self.residue + self.modulus * j) for j in range(ways)]


GROUP_MESSAGES: Final = 1 << 17
"""Input batches are taken this many messages at a time (storage/batch_groups.py)."""


def keyed_numbers(batches: list[pa.RecordBatch]) -> tuple[pa.Array, npt.NDArray[np.int64]]:
    """The keys of the keyed messages of some batches and their numbers 2 * offset + (1 if the value is not
    null)."""
    numbers = np.empty(sum(batch.num_rows for batch in batches), np.int64)
    start = 0
    for batch in batches:
        mine = numbers[start : start + batch.num_rows]
        np.left_shift(batch.column(0).to_numpy(), 1, out=mine)
        values = batch.column(3)
        np.bitwise_or(mine, values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else 1, out=mine)
        start += batch.num_rows
    keys = batches[0].column(2) if len(batches) == 1 else pa.concat_arrays([batch.column(2) for batch in batches])
    if keys.null_count:
        keyed = keys.is_valid()
        return keys.filter(keyed), numbers[keyed.to_numpy(zero_copy_only=False)]
    return keys, numbers


@dataclass
class Scan:
    """How far a pass has read: messages, and keyed messages (all of them, not only the pass's own)."""

    messages: int = 0
    keyed: int = 0


Piece = tuple[pa.Array, np.ndarray]
"""Codes and numbers of some keyed messages."""
Pieces = Iterator[Piece]


def cut_pieces(pieces: Pieces, piece_rows: Callable[[], int]) -> Iterator[list[Piece]]:
    """``pieces`` cut into runs of about ``piece_rows()`` messages (asked before each cut: it may change), each
    made of slices of the input: one slice unless less than half a piece was left over and carried on (those
    would be concatenated). Every message is in exactly one, in order."""
    carried: list[Piece] = []
    held = 0
    for codes, numbers in pieces:
        start = 0
        while start < len(numbers):
            wanted = piece_rows()
            left = len(numbers) - start
            if held + left < wanted // 2:
                carried.append((codes.slice(start), numbers[start:]))
                held += left
                break
            size = left if held + left <= wanted + wanted // 2 else max(0, wanted - held)
            if size:
                carried.append((codes.slice(start, size), numbers[start : start + size]))
                start += size
            yield carried
            carried, held = [], 0
    if carried:
        yield carried


def from_batches(batches: Iterable[pa.RecordBatch], coding: KeyCoding, part: Part, hashes: np.ndarray | None,
                  scan: Scan) -> Pieces:
    """(codes, numbers) of the pass's keyed messages, a group of input batches at a time."""
    for group in grouped(batches, GROUP_MESSAGES):
        scan.messages += sum(batch.num_rows for batch in group)
        keys, numbers = keyed_numbers(group)
        codes = coding.encode(keys)
        if hashes is not None and part.modulus > 1:
            mine = hashes[scan.keyed : scan.keyed + len(keys)] % np.uint64(part.modulus) == part.residue
            codes, numbers = codes.filter(pa.array(mine)), numbers[mine]
        scan.keyed += len(keys)
        yield codes, numbers
