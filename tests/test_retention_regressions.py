"""Regression tests for wrong answers found by tests/test_retention_model.py, each reduced to its smallest case."""

from __future__ import annotations

from compactor import Compactor
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


def test_a_compacted_consumer_reopened_at_0_gets_the_tombstone_of_a_message_it_received_unacknowledged(
        store: Store) -> None:
    """Received a=x, acknowledged nothing, reopened after a compaction that folded a's tombstone away: the
    redelivery must include the tombstone. Resuming at offset 0 used to be taken for 'nothing read' and served the
    new ledger, without a, so the consumer was left holding a=x for good."""
    store.create_topic("t", 1, config={"cleanup.policy": "compact,delete"})
    with Consumer(store, "t", "sub", read_compacted=True) as consumer:
        store.append("t", [(b"a", b"x"), (b"a", None)], partition=0)
        assert [batch["offset"].to_pylist() for batch in consumer.receive_batches(1)] == [[0]]
    Compactor(store).compact("t")
    with Consumer(store, "t", "sub", read_compacted=True) as consumer:
        again = [(offset, value) for batch in consumer.receive_batches()
                 for offset, value in zip(batch["offset"].to_pylist(), batch["value"].to_pylist(), strict=True)]
    assert again[-1] == (1, None)


def test_a_new_compacted_subscription_still_starts_with_the_compacted_view(store: Store) -> None:
    store.create_topic("t", 1, config={"cleanup.policy": "compact,delete"})
    store.append("t", [(b"a", b"x"), (b"a", b"y"), (b"b", b"z")], partition=0)
    Compactor(store).compact("t")
    with Consumer(store, "t", "sub", read_compacted=True) as consumer:
        offsets = [offset for batch in consumer.receive_batches() for offset in batch["offset"].to_pylist()]
    assert offsets == [1, 2]
