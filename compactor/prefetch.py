"""Read ahead on a thread of its own, so that reading (CRC-32C checks and batch decoding, which release the GIL
for their byte work) runs on one core while phase one's aggregation runs on the other."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Final, TypeVar, cast

T = TypeVar("T")
POLL_SECONDS: Final = 0.05
"""How often a producer blocked on a full queue looks whether the consumer has gone."""


@dataclass(frozen=True)
class _Failure:
    error: BaseException


_DONE: Final = object()


def prefetched(items: Iterable[T], *, depth: int) -> Generator[T, None, None]:
    """``items``, iterated up to ``depth`` ahead on another thread; its errors are raised here, in order. Only
    that thread touches ``items`` until this generator is exhausted or closed: close it when leaving early (it
then waits for the thread to stop)."""
    ahead: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as error:  # handed to the consumer, which raises it
            put(_Failure(error))

    thread = threading.Thread(target=produce, name="ledgerview-compaction-read", daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield cast(T, item)  # everything else in the queue came from ``items``
    finally:
        stop.set()
        thread.join()
