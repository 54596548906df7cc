"""Work on a thread pool with the results in order, a few items ahead: phase one's pairs and buckets are made on
the workers while the calling thread reads the input and holds the results."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(pool: Executor, work: Callable[[T], R], items: Iterable[T], *, ahead: int) -> Iterator[R]:
    """``work(item)`` for each of ``items`` on the pool's threads, at most ``ahead`` at a time, the results in
    the items' order. The items are taken on the calling thread."""
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
