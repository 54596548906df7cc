"""The storage engine: Kafka-style partition logs of Arrow batches, with indexes, checkpoints and recovery."""

from storage.append_path import AppendResult
from storage.errors import LedgerviewError
from storage.schema import MESSAGE_SCHEMA, Message
from storage.store import Store

__all__ = ["MESSAGE_SCHEMA", "AppendResult", "LedgerviewError", "Message", "Store"]
