"""Groups and subscriptions, managed (readers/groups.py): a Kafka group's commits and a ledgerview Consumer's
acknowledgements are listed and described together with their lag (and the compacted view's lag), reset to each
kind of target (checked before anything is written), and deleted per topic or whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactor import Compactor
from readers import Consumer
from readers.groups import (
    InvalidResetError,
    ResetTo,
    UnknownGroupError,
    delete_group,
    describe_group,
    list_groups,
    reset_offsets,
)
from storage import Store
from storage.cursors import SubscriptionCursor, write_subscription_cursor
from tests.cli_runner import run_main
from tests.conftest import ManualClock


def consume(store: Store, topic: str, name: str, count: int, *, read_compacted: bool) -> None:
    with Consumer(store, topic, name, read_compacted=read_compacted) as consumer:
        for _, message in zip(range(count), consumer, strict=False):
            consumer.acknowledge_cumulative(message)


def test_groups_are_listed_and_described_with_lag(store: Store) -> None:
    store.create_topic("t")
    store.append("t", [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("b", None)], partition=0)
    Compactor(store).compact("t")  # the compacted view: a@2, c@3 (b tombstoned)
    store.append("t", [("d", "5")], partition=0)
    consume(store, "t", "dashboard", 1, read_compacted=True)  # read a@2: next is 3
    consume(store, "t", "audit", 2, read_compacted=False)  # read 0, 1: next is 2
    write_subscription_cursor(store.partition_log("t", 0).folder,
                              SubscriptionCursor("kafka-app", 0, 6, False, None, 0))
    assert list_groups(store) == ["audit", "dashboard", "kafka-app"]
    [dashboard] = describe_group(store, "dashboard")
    assert (dashboard.committed, dashboard.end_offset, dashboard.lag, dashboard.compacted_lag) == (3, 6, 3, 2)
    [audit] = describe_group(store, "audit")
    assert (audit.committed, audit.lag, audit.read_compacted, audit.compacted_lag) == (2, 4, False, None)
    assert describe_group(store, "kafka-app")[0].lag == 0
    with pytest.raises(UnknownGroupError, match=r"No group or subscription named 'nobody'.*known: audit, dashboard"):
        describe_group(store, "nobody")


def test_reset_to_every_kind_of_target(store: Store, clock: ManualClock) -> None:
    store.create_topic("t", partitions=2)
    for index in range(10):
        store.append("t", [(f"k{index}", "v")], partition=index % 2)
        clock.advance(1_000)
    consume(store, "t", "g", 3, read_compacted=False)
    first = clock.now_ms - 10_000
    assert [r.after for r in reset_offsets(store, "g", "t", ResetTo("latest"))] == [5, 5]
    assert [r.after for r in reset_offsets(store, "g", "t", ResetTo("earliest"))] == [0, 0]
    assert [r.after for r in reset_offsets(store, "g", "t", ResetTo("shift-by", 2))] == [2, 2]
    assert [r.after for r in reset_offsets(store, "g", "t", ResetTo("shift-by", -9))] == [0, 0]
    assert [r.after for r in reset_offsets(store, "g", "t", ResetTo("datetime", first + 4_000))] == [2, 2]
    assert [r.after for r in reset_offsets(store, "g", "t", ResetTo("datetime", first + 99_000))] == [5, 5]
    dry = reset_offsets(store, "g", "t", ResetTo("offset", 1), partitions=[1], dry_run=True)
    assert [(r.partition, r.before, r.after) for r in dry] == [(1, 5, 1)]
    assert [p.committed for p in describe_group(store, "g")] == [5, 5]
    with pytest.raises(InvalidResetError, match="Cannot reset to offset 7 on t-0: it holds offsets 0 to 5"):
        reset_offsets(store, "g", "t", ResetTo("offset", 7))
    assert [p.committed for p in describe_group(store, "g")] == [5, 5]


def test_delete_on_one_topic_then_whole(store: Store) -> None:
    for topic in ("t", "u"):
        store.create_topic(topic)
        store.append(topic, [("a", "1")])
        consume(store, topic, "g", 1, read_compacted=False)
    assert delete_group(store, "g", ["t"]) == [("t", 0)]
    assert [(p.topic, p.partition) for p in describe_group(store, "g")] == [("u", 0)]
    assert delete_group(store, "g", ["t"]) == []  # it has a position, on u only
    assert delete_group(store, "g") == [("u", 0)]
    assert list_groups(store) == []
    with pytest.raises(UnknownGroupError):
        delete_group(store, "g")
    with pytest.raises(UnknownGroupError):  # a group that is nowhere, whatever topics are named
        delete_group(store, "g", ["t"])


def test_the_command_says_when_a_group_has_no_position_on_the_topics_named(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    for topic in ("t", "u"):
        store.create_topic(topic)
        store.append(topic, [("a", "1")])
    consume(store, "u", "g", 1, read_compacted=False)
    result = run_main(capsys, store.root, "groups", "delete", "g", "--topic", "t")
    assert (result.code, result.err.strip()) == (0, "g has no position on t: nothing was deleted.")
    assert run_main(capsys, store.root, "groups", "delete", "nobody", "--topic", "t").code == 3


def test_a_damaged_partition_is_described_with_its_error_beside_the_groups_other_positions(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One partition whose log does not open made list and describe fail for every group: the first tools an
    operator reaches for in an incident answered nothing about it."""
    with Store.open(data_dir) as store:
        store.create_topic("t", partitions=2)
        for partition in range(2):
            store.append("t", [(b"k%d" % i, b"v" * 50) for i in range(10)], partition=partition)
            write_subscription_cursor(store.partition_log("t", partition).folder,
                                      SubscriptionCursor("g", partition, 4, False, None, 0))
    [damaged] = (data_dir / "t-1").glob("*.log")
    flipped = bytearray(damaged.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    with Store.open(data_dir) as store:
        assert list_groups(store) == ["g"]
        sound, unreadable = describe_group(store, "g")
    assert (sound.partition, sound.end_offset, sound.lag, sound.error) == (0, 10, 6, None)
    assert (unreadable.partition, unreadable.committed, unreadable.end_offset, unreadable.lag) == (1, 4, None, None)
    assert unreadable.error is not None and str(damaged) in unreadable.error
    described = run_main(capsys, data_dir, "groups", "describe", "g")
    assert described.code == 1
    rows = [line.split() for line in described.out.splitlines()[1:]]
    assert [(row[1], row[2], row[3], row[4]) for row in rows] == [("0", "4", "10", "6"), ("1", "4", "-", "-")]
    assert f"t-1: its end and lag are unknown: CorruptSegmentError: Corrupt batch in {damaged}" in described.err


def test_a_topic_whose_metadata_record_is_damaged_hides_no_group(data_dir: Path) -> None:
    """Its partitions are found by their folders, and described with the record's error."""
    with Store.open(data_dir) as store:
        for topic in ("orders", "t"):
            store.create_topic(topic)
            store.append(topic, [(b"k", b"v")] * 3, partition=0)
            write_subscription_cursor(store.partition_log(topic, 0).folder,
                                      SubscriptionCursor("g", 0, 1, False, None, 0))
    record = data_dir / "__topics" / "t" / "topic.json"
    record.write_bytes(record.read_bytes()[:-5])
    with Store.open(data_dir) as store:
        assert list_groups(store) == ["g"]
        orders, damaged = describe_group(store, "g")
    assert (orders.topic, orders.end_offset, orders.lag, orders.error) == ("orders", 3, 2, None)
    assert (damaged.topic, damaged.partition, damaged.committed, damaged.end_offset) == ("t", 0, 1, None)
    assert damaged.error is not None and str(record) in damaged.error


def test_a_damaged_position_record_is_described_with_its_error_beside_the_groups_other_positions(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One cursor record that does not decode made ``groups describe`` fail for the whole group, hiding its sound
    positions."""
    with Store.open(data_dir) as store:
        store.create_topic("t", partitions=2)
        for partition in range(2):
            store.append("t", [(b"k%d" % i, b"v") for i in range(10)], partition=partition)
            write_subscription_cursor(store.partition_log("t", partition).folder,
                                      SubscriptionCursor("g", partition, 4, False, None, 0))
    [record] = (data_dir / "t-1").rglob("g*")
    record.write_bytes(record.read_bytes()[:-3])
    with Store.open(data_dir) as store:
        sound, damaged = describe_group(store, "g")
    assert (sound.partition, sound.committed, sound.lag, sound.error) == (0, 4, 6, None)
    assert (damaged.partition, damaged.committed, damaged.read_compacted, damaged.lag) == (1, None, None, None)
    assert damaged.error is not None and damaged.error.startswith("CorruptSubscriptionCursorError")
    described = run_main(capsys, data_dir, "groups", "describe", "g")
    assert described.code == 1
    rows = [line.split() for line in described.out.splitlines()[1:]]
    assert [row[:6] for row in rows] == [["t", "0", "4", "10", "6", "raw"], ["t", "1", "-", "-", "-", "-"]]
    assert "t-1: the group's position is unknown: CorruptSubscriptionCursorError" in described.err
