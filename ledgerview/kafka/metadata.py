"""ApiVersions, Metadata, FindCoordinator and InitProducerId: what a client asks before producing or consuming.

One broker, node 0, leads every partition with leader epoch 0 forever (clients then never validate positions with
OffsetForLeaderEpoch), is every group's coordinator, and lists each topic under its raw and its compacted name.
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
        topics = [_topic_metadata(view) for view in views if broker.allowed_topic(Operation.DESCRIBE, view.name)]
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
        return _topic_metadata(resolve_topic(broker.store, name, broker.options.compacted_suffix))
    except InvalidTopicNameError:
        return _topic_error(name, ErrorCode.INVALID_TOPIC_EXCEPTION)
    except UnknownTopicError:
        return _topic_error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    except CorruptDataError as error:  # its metadata record is damaged
        return _topic_error(name, unreadable(name, None, error))


def _topic_metadata(view: TopicView) -> Any:
    partition = MetadataResponse.MetadataResponseTopic.MetadataResponsePartition
    partitions = [partition(error_code=0, partition_index=index, leader_id=NODE_ID, leader_epoch=0,
                            replica_nodes=[NODE_ID], isr_nodes=[NODE_ID], offline_replicas=[])
                  for index in range(view.partitions)]
    return MetadataResponse.MetadataResponseTopic(error_code=0, name=view.name, is_internal=False,
                                                  partitions=partitions)


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
