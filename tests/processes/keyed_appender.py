"""Append keyed messages whose content follows from their offset: keyed_appender.py DATA_DIR TOPIC CALLS SIZE.

Message at offset o: key ``k{o * 7919 % 257}``, value None (a tombstone) when o % 13 == 0, else ``v{o}``.
"""

from __future__ import annotations

import sys

from storage import Store


def message_at(offset: int) -> tuple[bytes, bytes | None]:
    return f"k{offset * 7919 % 257}".encode(), None if offset % 13 == 0 else f"v{offset}".encode()


def main() -> None:
    folder, topic, calls, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with Store.open(folder) as store:
        for call in range(calls):
            first = call * size
            store.append(topic, [message_at(offset) for offset in range(first, first + size)], partition=0)


if __name__ == "__main__":
    main()
