"""ApiVersions, Metadata, FindCoordinator and InitProducerId: what a client asks before producing or consuming.

One broker, node 0, leads every partition with leader epoch 0 forever (clients then never validate positions with
OffsetForLeaderEpoch), is every group's coordinator, and lists each topic under its raw and its compacted name.

A partition the store knows to be damaged (its log failed to open on a check and its folder has not changed since:
``Store.known_damaged_partitions``, which opens nothing) is listed, under both names, with KAFKA_STORAGE_ERROR and
node 0 in its offline replicas, so admin tools show it offline; node 0 stays its leader, replica and in-sync replica.
Kafka, whose controller moves leadership off a replica on a failed log dir, answers a partition whose only replica is
there LEADER_NOT_AVAILABLE with no leader (KRaftMetadataCache.getPartitionMetadata), the replica kept in its replicas
and ISR and listed offline. Here there is no other broker to lead it, and a repaired partition opens again at the next
request that touches it, with no restart: keeping the leader lets clients keep asking (kafka-python and librdkafka
keep routing to it: tests/test_kafka_damaged_partition.py) and get the partition's own KAFKA_STORAGE_ERROR from
Fetch, ListOffsets and Produce, as they did, and the error says why it is offline, which LEADER_NOT_AVAILABLE would
not.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse

from ledgerview.kafka.authorizer import CLUSTER_NAME, Operation, ResourceType
from ledgerview.kafka.broker import CLUSTER_ID, NODE_ID, Broker
from ledgerview.kafka.protocol import VERSIONS, ApiKey, ErrorCode
from ledgerview.kafka.topics import TopicView, all_topic_views, resolve_topic, unreadable
from storage.errors import CorruptDataError, InvalidTopicNameError, UnknownTopicError

COORDINATOR_KEY_TYPE_GROUP = 0


def api_versions_response(version: int, error: ErrorCode = ErrorCode.NONE) -> Any:
    """The advertised ranges; for a version we do not speak, the v0-format error reply Kafka gives (KIP-511),
    which every client retries with the ApiVersions range it lists."""
    entry = ApiVersionsResponse.ApiVersion
    keys = [entry(api_key=key.value, min_version=versions.advertised_min, max_version=versions.maximum)
            for key, versions in VERSIONS.items() if error is ErrorCode.NONE or key is ApiKey.API_VERSIONS]
    return ApiVersionsResponse(version=version, error_code=error.value, api_keys=keys, throttle_time_ms=0)


def handle_api_versions(broker: Broker, request: Any, version: int) -> Any:
    return api_versions_response(version)


def handle_metadata(broker: Broker, request: Any, version: int) -> Any:
    listed_all = request.topics is None or (version == 0 and not request.topics)
    if listed_all:
        views, damaged = all_topic_views(broker.store, broker.options.compacted_suffix)
        topics = [_topic_metadata(broker, view) for view in views
                  if broker.allowed_topic(Operation.DESCRIBE, view.name)]
        topics += [_topic_error(name, ErrorCode.KAFKA_STORAGE_ERROR) for name in damaged
                   if broker.allowed_topic(Operation.DESCRIBE, name)]
    else:
        topics = [_requested_topic(broker, topic.name) for topic in request.topics]
    host, port = broker.advertised
    broker_entry = MetadataResponse.MetadataResponseBroker(node_id=NODE_ID, host=host, port=port, rack=None)
    return MetadataResponse(version=version, throttle_time_ms=0, brokers=[broker_entry], cluster_id=CLUSTER_ID,
                            controller_id=NODE_ID, topics=topics)


def _requested_topic(broker: Broker, name: str) -> Any:
    if not broker.allowed_topic(Operation.DESCRIBE, name):
        return _topic_error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    try:
        return _topic_metadata(broker, resolve_topic(broker.store, name, broker.options.compacted_suffix))
    except InvalidTopicNameError:
        return _topic_error(name, ErrorCode.INVALID_TOPIC_EXCEPTION)
    except UnknownTopicError:
        return _topic_error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    except CorruptDataError as error:  # its metadata record is damaged
        return _topic_error(name, unreadable(name, None, error))


def _topic_metadata(broker: Broker, view: TopicView) -> Any:
    damaged = broker.store.known_damaged_partitions(view.topic)
    partitions = [_partition_metadata(index, index in damaged) for index in range(view.partitions)]
    return MetadataResponse.MetadataResponseTopic(error_code=0, name=view.name, is_internal=False,
                                                  partitions=partitions)


def _partition_metadata(index: int, damaged: bool) -> Any:
    """Node 0 leads it; a damaged one is offline on node 0, and says why (the module's docstring)."""
    partition = MetadataResponse.MetadataResponseTopic.MetadataResponsePartition
    error = ErrorCode.KAFKA_STORAGE_ERROR if damaged else ErrorCode.NONE
    return partition(error_code=error.value, partition_index=index, leader_id=NODE_ID, leader_epoch=0,
                     replica_nodes=[NODE_ID], isr_nodes=[NODE_ID], offline_replicas=[NODE_ID] if damaged else [])


def _topic_error(name: str, error: ErrorCode) -> Any:
    return MetadataResponse.MetadataResponseTopic(error_code=error.value, name=name, is_internal=False,
                                                  partitions=[])


def handle_find_coordinator(broker: Broker, request: Any, version: int) -> Any:
    if version >= 1 and request.key_type != COORDINATOR_KEY_TYPE_GROUP:
        return FindCoordinatorResponse(version=version, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE.value,
                                       error_message="transactions are not supported", node_id=-1, host="",
                                       port=-1)
    if not broker.allowed(Operation.DESCRIBE, ResourceType.GROUP, request.key):
        return FindCoordinatorResponse(version=version, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED.value,
                                       error_message=None, node_id=-1, host="", port=-1)
    host, port = broker.advertised
    return FindCoordinatorResponse(version=version, throttle_time_ms=0, error_code=0, error_message=None,
                                   node_id=NODE_ID, host=host, port=port)


def handle_init_producer_id(broker: Broker, request: Any, version: int) -> Any:
    if request.transactional_id is not None:
        return InitProducerIdResponse(version=version, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE.value,
                                      producer_id=-1, producer_epoch=-1)
    if not _may_write_idempotently(broker):
        return InitProducerIdResponse(version=version, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED.value,
                                      producer_id=-1, producer_epoch=-1)
    return InitProducerIdResponse(version=version, throttle_time_ms=0, error_code=0,
                                  producer_id=broker.sequences.new_producer_id(), producer_epoch=0)


def _may_write_idempotently(broker: Broker) -> bool:
    """IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (Kafka since KIP-679)."""
    if broker.authorizer is None or broker.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME):
        return True
    return broker.authorizer.authorize_any(broker.session, Operation.WRITE, ResourceType.TOPIC)
