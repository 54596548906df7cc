"""The key index is written beside phase one and two, on a thread of its own.

Phase one hands over its survivors (keys and offsets) in runs of buckets (compactor/latest_offsets.py); each is
sorted by key and written as one sorted run of the ledger's key index (storage/key_index.py), on a thread, while
phase one finishes the next run's buckets or, for the last run, while phase two runs: sorting, Arrow and file
writes release the GIL, so the two cores share the work. A run is handed over only once the run before it is
written, so memory holds one run being indexed at a time, as the budget's run rule counts: a run ends before its
survivors (counted RUN_BYTES_PER_KEY times) and the pairs still held pass the run share, and the next run's
survivors are never more than the held pairs they come from.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from compactor.latest_offsets import LiveKeys
from storage.key_index import KeyIndexWriter


class KeyIndexRuns:
    def __init__(self, writer: KeyIndexWriter) -> None:
        self._writer = writer
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledgerview-key-index")
        self._pending: Future[None] | None = None

    def submit(self, live: LiveKeys) -> None:
        """Write the survivors of one run on the thread, once the run before it is written."""
        self._wait()
        self._pending = self._executor.submit(self._write, live)

    def _write(self, live: LiveKeys) -> None:
        self._writer.add_sorted_run(*live.sorted_by_key())

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __enter__(self) -> KeyIndexRuns:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Wait for the last run; its error is raised unless another is already on its way."""
        try:
            if error is None:
                self._wait()
        finally:
            self._executor.shutdown(wait=True)
