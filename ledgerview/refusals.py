"""Why a topic refuses a line's message, in the words ``produce`` and the service's directory source both use, and
the longest line either reads for a topic: room for a message of max.message.bytes written with a JSON escape for
every byte. A longer line is refused before it is read whole into memory."""

from __future__ import annotations

from storage.errors import KeylessMessageError, MessageTooLargeError

JSON_BYTES_PER_BYTE = 6
"""The most bytes a JSON line spends on one byte of a message: a ``\\u00XX`` escape."""


def max_line_bytes(max_message_bytes: int, chunk_bytes: int) -> int:
    """The longest line (with its line end) that may hold a message of at most ``max_message_bytes``; a chunk's
    worth is always read."""
    return max(chunk_bytes, JSON_BYTES_PER_BYTE * max_message_bytes)


def line_too_long(bound: int, max_message_bytes: int) -> str:
    return (f"the line is longer than {bound} bytes, the longest read for a message of at most the topic's "
            f"max.message.bytes={max_message_bytes} ({JSON_BYTES_PER_BYTE} times that, a JSON \\u escape's bytes "
            "for each byte, and a chunk's worth at least)")


def partition_lacking(partition: object, topic: str, partitions: int) -> str:
    return (f"'partition' is {partition}, and topic {topic!r} has partitions 0 to {partitions - 1} (leave it out, "
            "or null, for the partitioner's choice)")


def store_refusal(error: MessageTooLargeError | KeylessMessageError) -> str:
    """What the store's refusal of one message of an append says about it."""
    if isinstance(error, MessageTooLargeError):
        return f"the message is {error.size_bytes} bytes, over the topic's max.message.bytes={error.limit_bytes}"
    return "the message has no key, and the topic is compacted (cleanup.policy=compact)"
