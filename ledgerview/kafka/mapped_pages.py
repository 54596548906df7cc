"""Segment pages a Fetch read leave the endpoint's RSS once encoded.

The store reads segments and ledgers through read-only memory maps it keeps open (storage/segment.py), so every
page a fetch ever read stays mapped into the process, counted in its RSS, though it is the kernel's page cache: clean,
shared and reclaimable. Kafka serves fetches with sendfile and never maps segment data, so its RSS holds none of it.
Here, once a large Fetch response is selected (a batch's first read checks its CRC: every page of it) and then
after every DROP_EVERY_BYTES of fetched batches encoded, the read-only mappings of files in the data folder are
told MADV_DONTNEED: their pages leave this process's page tables but stay in the page cache, and a later read maps
them back (a minor fault, no disk read). Only read-only mappings are touched, so no written byte can be lost.
Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ledgerview.kafka.fetch_response import Buffer, FramedResponse, Piece

DROP_EVERY_BYTES = 16 * 1024 * 1024
"""Fetched bytes encoded between two drops: about the most segment pages fetches keep mapped meanwhile. A drop
reads /proc/self/maps (about 0.6 ms for the endpoint's 400 mappings), so it is not done more often."""
_MAPS = Path("/proc/self/maps")


class MappedPages:
    """Drops the data folder's mapped pages as fetched batches are encoded; used on the endpoint's event loop."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self._prefix = os.path.realpath(folder) + os.sep
        self._since = 0
        self.drops = 0
        """How many times the pages were dropped so far."""
        self._madvise: Callable[..., int] | None = None
        if _MAPS.exists() and hasattr(mmap, "MADV_DONTNEED"):
            madvise = ctypes.CDLL(None, use_errno=True).madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            self._madvise = madvise

    def watching(self, response: FramedResponse) -> FramedResponse:
        """``response`` whose pieces count towards the next drop as they are encoded; the pages its handler read
        to select and check its batches are dropped first when it is DROP_EVERY_BYTES or more."""
        if self._madvise is None:
            return response
        if sum(piece.size for piece in response.pieces) >= DROP_EVERY_BYTES:
            self.drop()
        return replace(response, pieces=[replace(piece, make=self._counted(piece)) for piece in response.pieces])

    def _counted(self, piece: Piece) -> Callable[[], Buffer]:
        def make() -> Buffer:
            data = piece.make()
            self._since += piece.size
            if self._since >= DROP_EVERY_BYTES:
                self.drop()
            return data
        return make

    def drop(self) -> None:
        """MADV_DONTNEED every read-only mapping of a file in the data folder."""
        self._since = 0
        if self._madvise is None:
            return
        maps = _MAPS.read_text()
        found = maps.find(" " + self._prefix)
        while found != -1:  # only the lines naming the folder are split
            line_end = maps.find("\n", found)
            fields = maps[maps.rfind("\n", 0, found) + 1 : line_end].split(None, 5)
            found = maps.find(" " + self._prefix, line_end)
            if len(fields) == 6 and "w" not in fields[1] and fields[5].startswith(self._prefix):
                start, end = (int(address, 16) for address in fields[0].split("-"))
                self._madvise(start, end - start, mmap.MADV_DONTNEED)
        self.drops += 1
