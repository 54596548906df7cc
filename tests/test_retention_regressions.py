"""Regression tests for wrong answers found by tests/test_retention_model.py, each reduced to its smallest case."""

from __future__ import annotations

from readers import Consumer
from storage import Store


def test_a_receive_cut_by_max_messages_inside_the_last_batch_leaves_the_rest_for_the_next(store: Store) -> None:
    """Two messages in one stored batch, the partition's last: receiving one, then the rest, must deliver the
    second. The read used to move the position to the end offset once past the cut batch, skipping it for good."""
    store.create_topic("t", 1)
    store.append("t", [(b"a", b"1"), (b"b", b"2")], partition=0)
    with Consumer(store, "t", "sub") as consumer:
        first = list(consumer.receive_batches(1))
        rest = list(consumer.receive_batches())
    assert [batch["offset"].to_pylist() for batch in first] == [[0]]
    assert [offset for batch in rest for offset in batch["offset"].to_pylist()] == [1]
