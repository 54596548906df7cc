"""What is done with each run of phase one's keys, on threads of their own, beside phase one and two.

Phase one hands over its finished keys in runs of buckets (compactor/latest_offsets.py). Two things are done with
each, each on a thread of its own, while phase one finishes the next run's buckets or, for the last run, while
phase two runs (sorting, Arrow's kernels and file writes release the GIL, so the cores share the work):

- its survivors are sorted by key and written as one sorted run of the ledger's key index (storage/key_index.py);
- for a layered run, the view's rows its keys replace are marked (compactor/replaced_rows.py).

A run is handed over only once every step is done with the run before it, so memory holds one run being worked
on at a time. The budget's run rule counts what the key index needs: a run ends before its survivors (counted
RUN_BYTES_PER_KEY times) and the pairs still held pass the run share, and the next run's survivors are never more
than the held pairs they come from. The marking's hash set of the run's keys and its group of the view's keys
(compactor/replaced_rows.py) come on top.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from compactor.latest_offsets import LiveKeys
from storage.key_index import KeyIndexWriter

RunStep = Callable[[LiveKeys], None]


def index_run(writer: KeyIndexWriter) -> RunStep:
    """The step that writes a run's survivors as a sorted run of ``writer``'s key index."""
    def write(live: LiveKeys) -> None:
        if len(live.offsets):
            writer.add_sorted_run(*live.sorted_by_key())
    return write


class RunWork:
    """Runs each of ``steps`` on each run handed over, a thread a step."""

    def __init__(self, steps: list[RunStep]) -> None:
        self._steps = steps
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(steps)),
                                            thread_name_prefix="ledgerview-compaction-runs")
        self._pending: list[Future[None]] = []

    def submit(self, live: LiveKeys) -> None:
        """Work on one run, once every step is done with the run before it."""
        self._wait()
        self._pending = [self._executor.submit(step, live) for step in self._steps]

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def __enter__(self) -> RunWork:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Wait for the last run; its first error is raised unless another is already on its way."""
        try:
            if error is None:
                self._wait()
        finally:
            self._executor.shutdown(wait=True)
