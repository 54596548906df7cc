"""What is done with each run of phase one's keys, on a thread of its own, beside phase one and two.

Phase one hands over its finished keys in runs of buckets (compactor/latest_offsets.py). Two things are done with
each, in order, on one thread, while phase one finishes the next run's buckets or, for the last run, while phase
two runs (sorting, Arrow's kernels and file writes release the GIL, so the two cores share the work):

- its survivors are sorted by key and written as one sorted run of the ledger's key index (storage/key_index.py);
- for a layered run, the view's rows its keys replace are marked (compactor/replaced_rows.py).

A run is handed over only once the run before it is done, so memory holds one run being worked on at a time, as
the budget's run rule counts: a run ends before its survivors (counted RUN_BYTES_PER_KEY times) and the pairs
still held pass the run share, and the next run's survivors are never more than the held pairs they come from.
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
    """Runs ``steps`` on each run handed over, in order, on a thread."""

    def __init__(self, steps: list[RunStep]) -> None:
        self._steps = steps
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledgerview-compaction-runs")
        self._pending: Future[None] | None = None

    def submit(self, live: LiveKeys) -> None:
        """Work on one run on the thread, once the run before it is done."""
        self._wait()
        self._pending = self._executor.submit(self._work, live)

    def _work(self, live: LiveKeys) -> None:
        for step in self._steps:
            step(live)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __enter__(self) -> RunWork:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        """Wait for the last run; its error is raised unless another is already on its way."""
        try:
            if error is None:
                self._wait()
        finally:
            self._executor.shutdown(wait=True)
