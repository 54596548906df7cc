"""Consume a topic through a durable subscription and acknowledge everything received.

Usage: python subscribe.py DATA_DIR TOPIC SUBSCRIPTION

Opening the consumer stores the subscription's initial position on each partition; each acknowledgement replaces
that record (fault tests set LEDGERVIEW_CRASH_AT to die inside one of those writes).
"""

from __future__ import annotations

import sys

from readers import Consumer

if __name__ == "__main__":
    data_dir, topic, subscription = sys.argv[1:4]
    with Consumer(data_dir, topic, subscription) as consumer:
        for message in consumer:
            consumer.acknowledge_cumulative(message)
