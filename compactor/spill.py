"""The spill of a phase one split into passes: each keyed message's key hash, and for fixed-width key codes also
its code and number (2 * offset + live bit), written once in input order to memory-mapped files, so that the
passes after a split compare hashes instead of reading the input again; and an estimate of the distinct keys
made from the hashes, which sizes the split."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa

from compactor.key_codes import KeyCoding, code_matrix
from compactor.passes import GROUP_MESSAGES, Part, Pieces, Scan, keyed_numbers
from storage.batch_groups import grouped

SAMPLED_HASHES: Final = 1 << 17
"""Hashed messages the estimate of distinct keys samples, about."""


@dataclass(frozen=True)
class Spill:
    """What passes after a split read instead of the input: each keyed message's key hash, and for fixed-width
    codes also its code and number (2 * offset + live bit), in input order, in memory-mapped files."""

    hashes: np.ndarray
    codes: np.ndarray | None
    numbers: np.ndarray | None
    messages: int


def distinct_keys(hashes: np.ndarray) -> int:
    """How many distinct keys there are, within about 1%: the distinct hashes among those that start with
    ``shift`` zero bits (a sample of the keys, not of the messages, so repeated messages do not bias it), times
    2**shift."""
    shift = max(0, math.ceil(math.log2(max(1, len(hashes)) / SAMPLED_HASHES)))
    sample = hashes if shift == 0 else hashes[(hashes >> np.uint64(64 - shift)) == 0]
    return len(np.unique(sample)) << shift


def write_spill(batches: Iterable[pa.RecordBatch], coding: KeyCoding, folder: Path) -> Spill:
    """Hash every keyed message's key once, into a memory-mapped file (8 bytes a message), so that later passes
    only compare; with fixed-width codes also write the codes and numbers, so that they read nothing else."""
    columns = ["hashes"] + (["codes", "numbers"] if coding.code_bytes else [])
    files = {name: (folder / f"{name}.bin").open("wb") for name in columns}
    messages = 0
    try:
        for group in grouped(batches, GROUP_MESSAGES):
            messages += sum(batch.num_rows for batch in group)
            keys, numbers = keyed_numbers(group)
            codes = coding.encode(keys)
            files["hashes"].write(coding.hashes(codes).data)
            if coding.code_bytes:
                files["codes"].write(code_matrix(codes).data)
                files["numbers"].write(numbers.data)
    finally:
        for file in files.values():
            file.close()

    def mapped(name: str, dtype: type[np.generic], width: int = 1) -> np.ndarray:
        size = (folder / f"{name}.bin").stat().st_size
        if size == 0:
            return np.empty((0, width) if width > 1 else 0, dtype)
        array = np.memmap(folder / f"{name}.bin", dtype=dtype, mode="r")
        return array.reshape(-1, width) if width > 1 else array

    if not coding.code_bytes:
        return Spill(mapped("hashes", np.uint64), None, None, messages)
    return Spill(mapped("hashes", np.uint64), mapped("codes", np.uint8, coding.code_bytes), mapped("numbers", np.int64),
                  messages)


def from_spill(spill: Spill, coding: KeyCoding, part: Part, rows: int, scan: Scan) -> Pieces:
    """(codes, numbers) of the pass's keyed messages, about ``rows`` at a time from the spill files."""
    assert spill.codes is not None and spill.numbers is not None
    scan.messages = spill.messages
    step = rows * part.modulus
    for start in range(0, len(spill.hashes), step):
        mine = np.flatnonzero(spill.hashes[start : start + step] % np.uint64(part.modulus) == part.residue) + start
        scan.keyed = min(len(spill.hashes), start + step)
        codes = np.ascontiguousarray(spill.codes[mine])
        yield (pa.Array.from_buffers(coding.arrow_type, len(mine), [None, pa.py_buffer(codes)]),
               np.asarray(spill.numbers[mine]))
