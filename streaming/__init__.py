"""Spark at both ends of the store: the "ledgerview" data source (Structured Streaming sink, Spark SQL batch reads
of either view, streaming source over the raw log), a local session helper and SQL views of every topic."""

from streaming.datasource import LedgerviewDataSource
from streaming.session import local_session
from streaming.source_offsets import DataLossError
from streaming.views import register_views

__all__ = ["DataLossError", "LedgerviewDataSource", "local_session", "register_views"]
