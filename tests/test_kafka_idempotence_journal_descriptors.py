"""A topic deleted and created anew gets its producer state loaded again (ledgerview/kafka/sequences.py): the old
state's journal descriptor is closed then, so re-creating a topic does not leak one descriptor each time."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ledgerview.kafka.sequences import ProducerSequences
from storage import Store
from storage.producer_state import JOURNAL

RECREATIONS = 5


def _open_journals() -> int:
    """Descriptors of this process open on a producer-state journal (one whose file was deleted too)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used, closed by now
            count += JOURNAL in os.readlink(f"/proc/self/fd/{fd}")  # "... (deleted)" once its topic is gone
    return count


def test_recreating_a_topic_closes_the_old_producer_states_journal(tmp_path: Path) -> None:
    sequences = ProducerSequences()
    with Store.open(tmp_path / "data") as store:
        before = _open_journals()
        for _ in range(RECREATIONS):
            store.create_topic("t", partitions=1)
            partition_log = store.partition_log("t", 0)
            with partition_log.writer_lock:
                partition_log.refresh()
                sequences.state_of(partition_log)
            store.delete_topic("t")
        assert _open_journals() - before <= 1  # the last topic's state, until the endpoint closes
        store.create_topic("t", partitions=1)
        partition_log = store.partition_log("t", 0)
        with partition_log.writer_lock:
            partition_log.refresh()
            state = sequences.state_of(partition_log)
            assert state is sequences.state_of(partition_log)  # the same log keeps its state
        sequences.close()
        assert _open_journals() == before
