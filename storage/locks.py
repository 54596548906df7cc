"""Advisory file locks that serialize writers across processes (``flock``) and across threads of one process.

The kernel drops a ``flock`` when its process dies, ``kill -9`` included, so a crashed writer never leaves a
partition locked.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from storage.errors import PartitionLockedError, ReadOnlyStoreError


class FileLock:
    """A re-entrant-per-thread exclusive lock on ``path``; ``wait=False`` raises PartitionLockedError if busy."""

    def __init__(self, path: Path, *, wait: bool = True) -> None:
        self.path = path
        self.wait = wait
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def __enter__(self) -> FileLock:
        self.acquire(wait=self.wait)
        return self

    @contextmanager
    def waiting(self) -> Iterator[FileLock]:
        """Hold the lock, waiting for it whatever ``wait`` says (for short internal work such as recovery)."""
        self.acquire(wait=True)
        try:
            yield self
        finally:
            self.__exit__(None, None, None)

    def acquire(self, *, wait: bool) -> None:
        if not self._thread_lock.acquire(blocking=wait):
            raise PartitionLockedError(str(self.path))
        if self._depth == 0:
            try:
                self._acquire_file_lock(wait)
            except BaseException:
                self._thread_lock.release()
                raise
        self._depth += 1

    def _acquire_file_lock(self, wait: bool) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PartitionLockedError(str(self.path)) from None
        self._fd = fd

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        self._thread_lock.release()


class RefusedLock(FileLock):
    """The lock of a read-only store: taking it raises ReadOnlyStoreError, so every change is refused where it
    would start, and nothing is created on disk."""

    def acquire(self, *, wait: bool) -> None:
        raise ReadOnlyStoreError(str(self.path))
