"""Progress bars for work that takes more than a moment (compaction, verify, large dumps).

Drawn on stderr with tqdm, and only when stderr is a terminal: piped or captured output gets no bar, so scripts and
logs stay clean. A bar appears only after half a second (``LEDGERVIEW_PROGRESS_DELAY_S`` changes it), so quick
runs never show one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
DELAY_S = float(os.environ.get("LEDGERVIEW_PROGRESS_DELAY_S", "0.5"))


def progress(items: Iterable[T], *, total: int | None = None, unit: str = "it", description: str = "") -> (
    Iterator[T]
):
    """Iterate ``items`` behind a bar on a terminal, plainly otherwise."""
    if not sys.stderr.isatty():
        yield from items
        return
    yield from tqdm(items, total=total, unit=unit, desc=description, delay=DELAY_S, leave=False,
                    file=sys.stderr)


class ByteProgress:
    """A bar counted in bytes, advanced by the caller as it works through files."""

    def __init__(self, total_bytes: int, description: str) -> None:
        self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=description, delay=DELAY_S,
                         leave=False, file=sys.stderr) if sys.stderr.isatty() else None

    def advance(self, size_bytes: int) -> None:
        if self._bar is not None:
            self._bar.update(size_bytes)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
