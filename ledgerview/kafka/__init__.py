"""A Kafka-protocol endpoint over the store: Kafka clients produce to and consume from ledgerview topics, and
read each topic's compacted view under ``<topic>.compacted``. See docs/kafka.md."""

from ledgerview.kafka.broker import EndpointOptions
from ledgerview.kafka.server import EndpointStartError, KafkaEndpoint, serve

__all__ = ["EndpointOptions", "EndpointStartError", "KafkaEndpoint", "serve"]
