"""ledgerview: keyed streams kept as a full history (the raw log) and a latest-per-key table (the compacted view)."""

__version__ = "0.1.0"
