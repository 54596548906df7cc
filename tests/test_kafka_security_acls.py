"""ACLs on the Kafka endpoint, seen through raw protocol requests over mutual TLS (the principal is the client
certificate's subject, User:CN=carol,OU=payments,O=Example Corp,C=GB): denied produce, fetch, offsets and group
operations get Kafka's TOPIC_/GROUP_/CLUSTER_AUTHORIZATION_FAILED, Metadata hides what may not be described,
DESCRIBE is implied by READ, prefixed ACLs and DENY work as Kafka's StandardAuthorizer, super.users bypass the
ACLs and allow.everyone.if.no.acl.found opens resources no ACL names."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.protocol.admin import DescribeAclsRequest, DescribeAclsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, JoinGroupRequest, JoinGroupResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse

from ledgerview.cli import main
from ledgerview.kafka.protocol import ErrorCode
from ledgerview.kafka.security_options import SecurityProtocol
from storage import Store
from tests.security_support import CLIENT_SUBJECT, Pki, Secured, pki, secured, start_secured, tls_handshake_fails

__all__ = ["pki", "secured"]

PRINCIPAL = f"User:{CLIENT_SUBJECT}"


def _acl(data: Path, *arguments: str) -> None:
    assert main(["--data", str(data), "acls", *arguments]) == 0


def _metadata_topics(secured: Secured) -> dict[str, int]:
    client = secured.tls_client(certificate=secured.pki.client, key=secured.pki.client_key)
    try:
        response = client.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), MetadataResponse, 8)
        return {topic.name: topic.error_code for topic in response.topics}
    finally:
        client.close()


def test_metadata_hides_topics_the_certificate_principal_may_not_describe(secured: Secured) -> None:
    for topic in ("orders", "orders-eu", "payroll"):
        secured.store.create_topic(topic)
    assert _metadata_topics(secured) == {}
    _acl(secured.data, "add", "--allow-principal", PRINCIPAL, "--operation", "Read", "--topic", "orders",
         "--resource-pattern-type", "prefixed")
    assert _metadata_topics(secured) == {"orders": 0, "orders.compacted": 0, "orders-eu": 0, "orders-eu.compacted": 0}
    _acl(secured.data, "add", "--deny-principal", PRINCIPAL, "--operation", "Describe", "--topic", "orders-eu")
    assert set(_metadata_topics(secured)) == {"orders", "orders.compacted"}


def test_denied_produce_fetch_metadata_and_groups_get_kafkas_errors(secured: Secured) -> None:
    secured.store.create_topic("payroll")
    client = secured.tls_client(certificate=secured.pki.client, key=secured.pki.client_key)
    try:
        metadata = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="payroll")],
                                                  allow_auto_topic_creation=False), MetadataResponse, 8)
        assert metadata.topics[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        produce = client.request(ProduceRequest(acks=1, timeout_ms=1000, topic_data=[
            ProduceRequest.TopicProduceData(name="payroll", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=b"x")])]), ProduceResponse, 7)
        assert produce.responses[0].partition_responses[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        fetch = client.request(FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                            isolation_level=0, session_id=0, session_epoch=-1, topics=[
            FetchRequest.FetchTopic(topic="payroll", partitions=[FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""), FetchResponse, 11)
        assert fetch.responses[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert fetch.responses[0].partitions[0].records in (b"", None)
        coordinator = client.request(FindCoordinatorRequest(key="payroll-readers", key_type=0),
                                     FindCoordinatorResponse, 2)
        assert coordinator.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        join = client.request(JoinGroupRequest(group_id="payroll-readers", session_timeout_ms=10000,
                                               rebalance_timeout_ms=10000, member_id="", protocol_type="consumer",
                                               protocols=[]), JoinGroupResponse, 5)
        assert join.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        producer_id = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1000),
                                     InitProducerIdResponse, 1)
        assert producer_id.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        acls = client.request(DescribeAclsRequest(resource_type_filter=1, resource_name_filter=None,
                                                  pattern_type_filter=1, principal_filter=None, host_filter=None,
                                                  operation=1, permission_type=1), DescribeAclsResponse, 1)
        assert acls.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    finally:
        client.close()
    assert secured.store.end_offset("payroll", 0) == 0


def test_write_acl_allows_an_idempotent_producer_and_implies_describe(secured: Secured) -> None:
    secured.store.create_topic("orders")
    _acl(secured.data, "add", "--allow-principal", PRINCIPAL, "--operation", "Write", "--topic", "orders")
    client = secured.tls_client(certificate=secured.pki.client, key=secured.pki.client_key)
    try:
        producer_id = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1000),
                                     InitProducerIdResponse, 1)
        assert producer_id.error_code == 0
    finally:
        client.close()
    assert _metadata_topics(secured) == {"orders": 0, "orders.compacted": 0}


def test_super_users_and_allow_everyone_if_no_acl_found(tmp_path: Path, pki: Pki) -> None:
    data = tmp_path / "data"
    with Store.open(data) as store:
        store.create_topic("open")
        store.create_topic("closed")
        _acl(data, "add", "--allow-principal", "User:someone-else", "--operation", "Read", "--topic", "closed")
        endpoint = start_secured(data, pki, **{"allow.everyone.if.no.acl.found": "true"})
        try:
            secured = Secured(endpoint, data, store, pki)
            assert _metadata_topics(secured) == {"open": 0, "open.compacted": 0}
        finally:
            endpoint.stop()
        endpoint = start_secured(data, pki, **{"super.users": PRINCIPAL})
        try:
            secured = Secured(endpoint, data, store, pki)
            assert set(_metadata_topics(secured)) == {"open", "open.compacted", "closed", "closed.compacted"}
        finally:
            endpoint.stop()


@pytest.mark.parametrize("kind", ["no certificate", "expired", "untrusted"])
def test_ssl_listener_refuses_clients_without_a_trusted_certificate(secured: Secured, kind: str) -> None:
    pki = secured.pki
    certificate, key = {"no certificate": (None, None), "expired": (pki.expired, pki.expired_key),
                        "untrusted": (pki.stranger, pki.stranger_key)}[kind]
    assert tls_handshake_fails(secured.endpoint.port_of(SecurityProtocol.SSL), pki, certificate, key)
    assert not tls_handshake_fails(secured.endpoint.port_of(SecurityProtocol.SSL), pki, pki.client, pki.client_key)
