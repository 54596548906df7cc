"""Durable subscriptions: Consumer and its cursor record (storage/cursors.py).

Checks that a consumer that reopens resumes after its last acknowledgement on both views, that acknowledgements
never move back (in one consumer and across consumers), that an acknowledgement of a position that exists only in
the compacted ledger is accepted (Pulsar PR #25998) and that a reopened compacted consumer does not skip the
tombstones a newer compaction folded away (Pulsar PR #26190). Invariant 4 (keys stay in the compacted view after
retention) through the consumer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from readers import AcknowledgementOutOfRangeError, Consumer
from storage import MESSAGE_SCHEMA, Message, Store
from storage.cursors import (
    MAX_SUBSCRIPTION_NAME_LENGTH,
    CorruptSubscriptionCursorError,
    InvalidSubscriptionNameError,
    SubscriptionCursor,
    read_subscription_cursor,
    write_subscription_cursor,
)
from storage.files import subscription_file
from storage.schema import messages_from_table
from tests.test_readers import Model, retire_raw_below


def received(consumer: Consumer, max_messages: int | None = None) -> list[Message]:
    """Messages of one receive_batches call, checked to be Arrow batches of the message schema."""
    batches = list(consumer.receive_batches(max_messages))
    assert all(batch.schema == MESSAGE_SCHEMA for batch in batches)
    return messages_from_table(pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA))


@pytest.fixture
def model(store: Store) -> Model:
    """Two partitions: six messages each over three keys, compacted, then a tail of two (a tombstone of k0)."""
    model = Model(store, "prices", partitions=2)
    for partition in range(2):
        model.append([(f"k{i % 3}".encode(), f"p{partition}v{i}".encode()) for i in range(6)], partition=partition)
    model.compact()
    for partition in range(2):
        model.append([(b"k0", None), (b"k1", f"p{partition}tail".encode())], partition=partition)
    return model


@pytest.mark.parametrize("read_compacted", [False, True])
def test_a_consumer_that_reopens_resumes_after_its_last_acknowledgement(store: Store, model: Model,
                                                                        read_compacted: bool) -> None:
    view = {p: model.compacted(p) if read_compacted else model.raw(p) for p in range(2)}
    with Consumer(store, "prices", "audit", read_compacted=read_compacted) as consumer:
        first = received(consumer, max_messages=2)
        assert first == view[0][:2]
        consumer.acknowledge_cumulative(first[-1])
        more = received(consumer, max_messages=1)  # received, never acknowledged: delivered again on reopen
        assert more == view[0][2:3]
    with Consumer(store, "prices", "audit", read_compacted=read_compacted) as consumer:
        assert consumer.acknowledged == {0: first[-1].offset + 1, 1: 0}
        rest = list(consumer)
        assert rest == view[0][2:] + view[1]
        consumer.acknowledge_cumulative(1, rest[-1].offset)
        assert list(consumer) == []
    with Consumer(store, "prices", "audit", read_compacted=read_compacted) as consumer:
        assert list(consumer) == view[0][2:]


def test_acknowledgements_never_move_back(store: Store, model: Model, data_dir: Path) -> None:
    with Consumer(store, "prices", "audit") as consumer:
        messages = list(consumer)
        consumer.acknowledge_cumulative(0, 5)
        consumer.acknowledge_cumulative(0, 2)
        assert consumer.acknowledged[0] == 6
        stale = Consumer(data_dir, "prices", "audit")  # another consumer object, opened before the next ack
        consumer.acknowledge_cumulative(0, 7)
        stale.acknowledge_cumulative(0, 6)  # older than what is stored now: the stored position stays
        assert stale.acknowledged[0] == 8
        stale.close()
    with Consumer(store, "prices", "audit") as consumer:
        assert consumer.acknowledged[0] == 8
        assert list(consumer) == [m for m in messages if m.partition == 1]


def test_an_acknowledgement_only_the_compacted_ledger_holds_is_accepted(store: Store) -> None:
    """Pulsar PR #25998: the raw segment of the acknowledged message is gone; the ack must still count."""
    model = Model(store, "prices")
    for i in range(30):
        model.append([(f"k{i % 4}".encode(), f"v{i}".encode())])
    model.compact()
    model.append([(b"k9", b"tail")])
    log_start = retire_raw_below(store, "prices", 0, model.horizons[0] + 1)
    snapshot = model.snapshot(0)
    assert snapshot[0].offset < log_start
    with Consumer(store, "prices", "snap", read_compacted=True) as consumer:
        first = received(consumer, max_messages=1)
        assert first == snapshot[:1]
        consumer.acknowledge_cumulative(first[0])
        assert consumer.acknowledged == {0: snapshot[0].offset + 1}
    with Consumer(store, "prices", "snap", read_compacted=True) as consumer:
        assert list(consumer) == snapshot[1:] + model.raw(0, model.horizons[0] + 1)


def test_a_reopened_compacted_consumer_does_not_skip_tombstones_of_a_newer_compaction(store: Store) -> None:
    """Pulsar PR #26190 on reopen: the consumer acknowledged half of ledger 1; ledger 2 replaced it and folded a
    tombstone of a key already received. Resuming on the raw log from the acknowledged position delivers it."""
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")])
    model.compact()
    state: dict[bytes | None, bytes | None] = {}
    with Consumer(store, "prices", "table", read_compacted=True) as consumer:
        for message in received(consumer, max_messages=2):
            state[message.key] = message.value
            consumer.acknowledge_cumulative(message)
    model.append([(b"a", None), (b"c", b"2")])
    model.compact()
    with Consumer(store, "prices", "table", read_compacted=True) as consumer:
        resumed = list(consumer)
    assert (b"a", None) in [(m.key, m.value) for m in resumed]
    for message in resumed:
        state[message.key] = message.value
    assert {k: v for k, v in state.items() if v is not None} == model.latest()


def test_a_compacted_consumer_resumes_on_the_same_ledger_when_it_is_still_current(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"a", b"2"), (b"b", b"1"), (b"b", b"2"), (b"c", b"1")])
    model.compact()
    with Consumer(store, "prices", "table", read_compacted=True) as consumer:
        consumer.acknowledge_cumulative(received(consumer, max_messages=1)[0])
    with Consumer(store, "prices", "table", read_compacted=True) as consumer:
        assert list(consumer) == model.snapshot(0)[1:]  # the ledger, not the raw versions below the horizon


def test_the_initial_position_is_stored_when_the_subscription_is_created(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1")])
    Consumer(store, "prices", "late", initial_position="latest").close()
    Consumer(store, "prices", "early", initial_position="earliest").close()
    appended = model.append([(b"b", b"2")])
    with Consumer(store, "prices", "late", initial_position="earliest") as consumer:  # exists: ignored
        assert list(consumer) == appended
    with Consumer(store, "prices", "early") as consumer:
        assert list(consumer) == model.raw(0)


def test_the_cursor_record_is_one_json_file_per_partition_and_subscription(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1"), (b"a", b"2")])
    model.compact()
    folder = store.partition_log("prices", 0).folder
    with Consumer(store, "prices", "audit.v1", read_compacted=True) as consumer:
        consumer.acknowledge_cumulative(received(consumer)[0])
    path = subscription_file(folder, "audit.v1")
    record = json.loads(path.read_bytes())["body"]  # storage/records.py's envelope
    assert record["acked_offset"] == 2 and record["read_compacted"] is True and record["partition"] == 0
    cursor = read_subscription_cursor(folder, "audit.v1", 0)
    assert cursor is not None and cursor.subscription == "audit.v1"
    write_subscription_cursor(folder, SubscriptionCursor("audit.v1", 0, 1, False, None, 5))
    assert read_subscription_cursor(folder, "audit.v1", 0) == SubscriptionCursor("audit.v1", 0, 1, False, None, 5)
    path.write_bytes(b'{"version": 1, "subscription": "audit.v1"}')
    with pytest.raises(CorruptSubscriptionCursorError, match="Remove it"):
        read_subscription_cursor(folder, "audit.v1", 0)
    damaged = bytearray(SubscriptionCursor("audit.v1", 0, 1, False, None, 5).encode())
    damaged[damaged.index(b'"acked_offset": 1') + 16] = ord("7")  # still JSON, no longer what was written
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptSubscriptionCursorError, match="CRC-32C"):
        read_subscription_cursor(folder, "audit.v1", 0)


@pytest.mark.parametrize("name", ["", "..", "a/b", "naïve", "x" * (MAX_SUBSCRIPTION_NAME_LENGTH + 1)])
def test_invalid_subscription_names_are_refused(store: Store, name: str) -> None:
    Model(store, "prices")
    with pytest.raises(InvalidSubscriptionNameError, match="follows the topic-name rules"):
        Consumer(store, "prices", name)


def test_the_longest_subscription_name_works(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1")])
    with Consumer(store, "prices", "s" * MAX_SUBSCRIPTION_NAME_LENGTH) as consumer:
        consumer.acknowledge_cumulative(received(consumer)[0])


def test_acknowledging_an_offset_past_the_end_is_refused(store: Store) -> None:
    model = Model(store, "prices")
    model.append([(b"a", b"1")])
    with Consumer(store, "prices", "audit") as consumer:
        with pytest.raises(AcknowledgementOutOfRangeError, match="its offsets are below 1"):
            consumer.acknowledge_cumulative(0, 1)
        with pytest.raises(TypeError):
            consumer.acknowledge_cumulative(0)
