"""Groups managed over the Kafka protocol with confluent-kafka's AdminClient against the endpoint: list, describe,
list and alter committed offsets, delete (refused while the group has a member, as Kafka refuses it); the same
positions a ledgerview subscription and 'ledgerview groups' see (readers/groups.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from readers.groups import describe_group, list_groups
from storage.cursors import SubscriptionCursor, write_subscription_cursor
from tests.kafka_support import Running, kafka

__all__ = ["kafka"]
TIMEOUT_S = 20


def admin(running: Running) -> AdminClient:
    return AdminClient({"bootstrap.servers": running.bootstrap})


@pytest.mark.slow
def test_the_admin_client_lists_describes_alters_and_deletes_groups(kafka: Running) -> None:
    kafka.store.create_topic("jobs", partitions=2)
    kafka.store.append("jobs", [(f"k{i}", f"v{i}") for i in range(20)])
    write_subscription_cursor(kafka.store.partition_log("jobs", 0).folder,
                              SubscriptionCursor("dashboard", 0, 3, False, None, 0))
    client = admin(kafka)

    listed = client.list_consumer_groups().result(TIMEOUT_S)
    assert [group.group_id for group in listed.valid] == ["dashboard"]
    [described] = client.describe_consumer_groups(["dashboard"])["dashboard"].result(TIMEOUT_S).members or [None]
    assert described is None  # no member: an empty group with committed positions

    request = [ConsumerGroupTopicPartitions("dashboard", [TopicPartition("jobs", 0), TopicPartition("jobs", 1)])]
    offsets = client.list_consumer_group_offsets(request)["dashboard"].result(TIMEOUT_S)
    assert [(tp.partition, tp.offset) for tp in offsets.topic_partitions] == [(0, 3), (1, -1001)]

    altered = [ConsumerGroupTopicPartitions("dashboard", [TopicPartition("jobs", 1, 7)])]
    client.alter_consumer_group_offsets(altered)["dashboard"].result(TIMEOUT_S)
    assert [(p.partition, p.committed) for p in describe_group(kafka.store, "dashboard")] == [(0, 3), (1, 7)]

    member = ConfluentConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": "dashboard",
                                "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    try:
        member.subscribe(["jobs"])
        while not member.assignment():
            member.poll(0.2)
        with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
            client.delete_consumer_groups(["dashboard"])["dashboard"].result(TIMEOUT_S)
        live = client.describe_consumer_groups(["dashboard"])["dashboard"].result(TIMEOUT_S)
        assert len(live.members) == 1
    finally:
        member.close()
    client.delete_consumer_groups(["dashboard"])["dashboard"].result(TIMEOUT_S)
    assert list_groups(kafka.store) == []
    with pytest.raises(KafkaException, match="GROUP_ID_NOT_FOUND"):
        client.delete_consumer_groups(["dashboard"])["dashboard"].result(TIMEOUT_S)
