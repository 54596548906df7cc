"""Readers of a topic's two views: Reader (non-durable), Consumer (durable subscription with cumulative acks) and
TableView (latest value per key).

``read_compacted=True`` serves the compacted view: each key's latest live message up to the compaction horizon
(from the compacted ledger, with original offsets), then every raw message above the horizon, tombstones included
(DESIGN.md invariant 4). Reads go through ``storage`` only; the compactor is another part (and often another
process) whose only interface with readers is the compaction cursor record and the ledger files.
"""

from readers.consumer import Consumer
from readers.errors import AcknowledgementOutOfRangeError, InvalidPositionError, ReaderClosedError
from readers.positions import EARLIEST, LATEST, Earliest, Latest, StartPosition, Timestamp
from readers.reader import Reader, read_table
from readers.table_view import TableView
from readers.topic_read import TopicRead

__all__ = [
    "EARLIEST",
    "LATEST",
    "AcknowledgementOutOfRangeError",
    "Consumer",
    "Earliest",
    "InvalidPositionError",
    "Latest",
    "Reader",
    "ReaderClosedError",
    "StartPosition",
    "TableView",
    "Timestamp",
    "TopicRead",
    "read_table",
]
