"""Zero-copy numpy views of a binary Arrow array's offsets, for the columnar code that sizes, slices or hashes the
values itself (an array's ``offset`` says where a slice starts in buffers it shares with its parent)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def value_offsets(array: pa.Array) -> npt.NDArray[np.int32]:
    """The ``len(array) + 1`` int32 offsets of the values in the data buffer; a null's slot spans no bytes."""
    buffer = array.buffers()[1]
    if buffer is None:  # an empty array may come without buffers
        return np.zeros(len(array) + 1, np.int32)
    return np.frombuffer(buffer, np.int32, len(array) + 1, array.offset * 4)


def value_lengths(array: pa.Array) -> npt.NDArray[np.int32]:
    """Bytes of each value (0 for a null)."""
    return np.diff(value_offsets(array))
