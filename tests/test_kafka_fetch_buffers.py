"""Fetched batches are laid out once and encoded into reused buffers (ledgerview/kafka/batch_layouts.py,
batch_buffers.py, batch_cache.py): encoding into a buffer that holds a former batch's bytes gives the bytes a fresh
buffer gets, on both encoding paths; a written batch's buffer is reused for the next batch of its size class, as is
the buffer of a batch the full fetch cache evicts, and one a transport still holds (part of an unsent response) is
never reused; each batch is counted in
queued.max.request.bytes at least at its buffer; the layout computed to size a batch is kept, counted in the pool's
free room, until the batch is encoded, and dropped when the pool needs the room; once everything is sent the pool
holds only the free buffers, within its bound. Against a real endpoint, kafka-python reads back every message
exactly while the buffers are reused."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatch

from ledgerview.kafka import EndpointOptions, KafkaEndpoint
from ledgerview.kafka.batch_buffers import REUSED_BATCH_BYTES_MIN, BatchBuffers
from ledgerview.kafka.batch_cache import EncodedBatchCache
from ledgerview.kafka.batch_layouts import LAYOUTS_BYTES_MAX, BatchLayouts
from ledgerview.kafka.broker import Broker
from ledgerview.kafka.connection import KafkaConnection
from ledgerview.kafka.fetch import handle_fetch
from ledgerview.kafka.record_encoding import encode_batch, record_layout
from ledgerview.kafka.request_queue import QueuedRequestBytes
from ledgerview.kafka.response_sender import ResponseSender
from storage import Store
from storage.schema import HEADER_TYPE
from tests.kafka_support import consumed_from_start, fetch_request

VALUE_BYTES = 1200
BATCH_MESSAGES = 250
"""Messages per fetch in the endpoint-level tests: a batch of about 300 KB, in the 320 KiB size class."""
FETCH_BYTES = BATCH_MESSAGES * (VALUE_BYTES + 16 + 8) + 100
"""A fetch budget that takes exactly BATCH_MESSAGES of them (each estimated at key + value + 16 bytes)."""
MiB = 1024 * 1024


def _batch(count: int, *, general: bool) -> pa.RecordBatch:
    """``count`` messages of one shape (the uniform path) or, when ``general``, of mixed sizes with null keys and
    headers (the general path)."""
    rng = np.random.default_rng(count)
    sizes = rng.integers(0, 400, count) if general else np.full(count, 300)
    keys = [None if general and index % 7 == 0 else b"k%05d" % index for index in range(count)]
    return pa.RecordBatch.from_arrays([
        pa.array(np.arange(count) * 2 + 50, pa.int64()),
        pa.array(1_700_000_000_000 + np.arange(count), pa.int64()),
        pa.array(keys, pa.binary()),
        pa.array([rng.bytes(int(size)) for size in sizes], pa.binary()),
        pa.array([[{"key": "h", "value": b"v"}] if general and index % 5 == 0 else None for index in range(count)],
                 HEADER_TYPE),
    ], names=["offset", "timestamp", "key", "value", "headers"])


@pytest.mark.parametrize("general", [False, True], ids=["uniform", "general"])
def test_a_batch_encoded_into_a_used_buffer_is_the_batch_a_fresh_buffer_gets(general: bool) -> None:
    batch = _batch(1000, general=general)
    used = memoryview(bytearray(b"\xa5" * record_layout(batch).batch_bytes))
    assert bytes(encode_batch(batch, into=used)) == bytes(encode_batch(batch))
    assert DefaultRecordBatch(bytes(used)).validate_crc()


def test_a_batch_is_charged_at_least_the_buffer_it_is_encoded_into() -> None:
    buffers = BatchBuffers(QueuedRequestBytes(64 * MiB))
    for size in (REUSED_BATCH_BYTES_MIN - 1, REUSED_BATCH_BYTES_MIN, 300_001, MiB, MiB + 1, 5 * MiB):
        batch = buffers.take(size)
        buffer = batch.obj
        assert isinstance(buffer, bytearray) and len(batch) == size <= len(buffer) <= BatchBuffers.charge(size)
        assert BatchBuffers.charge(size) <= max(size + size // 4, REUSED_BATCH_BYTES_MIN)
        buffers.give_back(batch)
        assert buffers.take(size).obj is buffer or not REUSED_BATCH_BYTES_MIN <= size <= 4 * MiB


def test_a_batch_the_full_cache_evicts_gives_its_buffer_to_the_next_batch() -> None:
    pool = QueuedRequestBytes(64 * MiB)
    cache = EncodedBatchCache(2 * MiB)
    cache.count_in(pool)
    kept = []
    for number in range(4):
        key = ("t", 0, False, 0, number, number, 1)

        def encode(fill: int = number) -> memoryview:
            batch = cache.buffer(MiB - 100)
            batch[:] = bytes([fill]) * len(batch)
            return batch

        encoded = cache.get_or_encode(key, encode)
        cache.written(key, encoded)
        assert isinstance(encoded, memoryview)
        kept.append(encoded.obj)
        assert cache.get_or_encode(key, encode) is encoded  # cached
    # Two batches fill the cache; admitting the third evicts the first, whose buffer the fourth takes.
    assert len({id(buffer) for buffer in kept[:3]}) == 3 and kept[3] is kept[0]
    assert cache.size_bytes == 2 * MiB and pool.cached_bytes == 3 * MiB  # two entries, one free buffer
    assert bytes(cache.get_or_encode(("t", 0, False, 0, 3, 3, 1), bytes)) == bytes([3]) * (MiB - 100)


class _UnsentTransport(asyncio.Transport):
    """Sends nothing until ``send``: keeps a copy of what is written to it (as Python 3.11's socket transport
    copies what the socket did not take at once), or with ``views`` the written buffer itself (as 3.12's keeps a
    view of it)."""

    def __init__(self, *, views: bool) -> None:
        super().__init__()
        self.views = views
        self.unsent: list[memoryview] = []

    def write(self, data: Any) -> None:
        self.unsent.append(memoryview(data) if self.views else memoryview(bytes(data)))

    def send(self) -> list[bytes]:
        sent = [bytes(view) for view in self.unsent]
        self.unsent.clear()
        return sent

    def get_write_buffer_size(self) -> int:
        return sum(len(view) for view in self.unsent)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _endpoint_parts(data: Path, test: Callable[[Broker, ResponseSender, _UnsentTransport, QueuedRequestBytes],
                                                Coroutine[Any, Any, None]], *, views: bool) -> None:
    """Run ``test`` with a broker over ``data`` (fetch cache too small to keep a batch: every written batch's
    buffer goes back) counted in a pool, and a sender on a connection whose transport sends nothing until told
    (``views``: see _UnsentTransport)."""
    async def run() -> None:
        with Store.open(data) as store:
            broker = Broker(store, EndpointOptions(port=0, fetch_cache_bytes=1), 0)
            pool = QueuedRequestBytes(64 * MiB)
            broker.fetch_cache.count_in(pool)
            connection = KafkaConnection(_serve_nothing)
            transport = _UnsentTransport(views=views)
            connection.connection_made(transport)

            async def drained() -> None:
                pass

            try:
                await test(broker, ResponseSender(connection, pool, drained), transport, pool)
            finally:
                broker.heavy_work.close()

    asyncio.run(run())


async def _serve_nothing(connection: KafkaConnection) -> None:
    pass


def _stored(data: Path, messages: int) -> list[bytes]:
    values = [bytes([index % 251]) * VALUE_BYTES for index in range(messages)]
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
        store.append("t", [(b"k%07d" % index, value) for index, value in enumerate(values)], partition=0)
    return values


async def _send_fetch(broker: Broker, sender: ResponseSender, offset: int) -> None:
    request = fetch_request("t", offset=offset, max_bytes=FETCH_BYTES)
    response = await handle_fetch(broker, request, 11)
    await sender.send(response.framed(offset))


def _batches(frame_pieces: list[bytes]) -> list[list[tuple[int, bytes | None]]]:
    """The records of each batch piece written (the pieces of at least REUSED_BATCH_BYTES_MIN)."""
    return [[(record.offset, record.value) for record in DefaultRecordBatch(piece)]
            for piece in frame_pieces if len(piece) >= REUSED_BATCH_BYTES_MIN]


def test_a_written_batchs_buffer_is_reused_for_the_next_batch(tmp_path: Path) -> None:
    values = _stored(tmp_path / "data", 3 * BATCH_MESSAGES)

    async def test(broker: Broker, sender: ResponseSender, transport: _UnsentTransport,
                   pool: QueuedRequestBytes) -> None:
        for start in range(0, 3 * BATCH_MESSAGES, BATCH_MESSAGES):
            await _send_fetch(broker, sender, start)
            sent = transport.send()
            assert _batches(sent) == [[(offset, values[offset]) for offset in range(start, start + BATCH_MESSAGES)]]
            # One free buffer, of the batch's class, however many batches were written: each took the last one's.
            buffer_bytes = BatchBuffers.charge(max(len(piece) for piece in sent))
            assert pool.cached_bytes == buffer_bytes
        sender.close()  # the connection ends: what it held for the responses is released
        assert pool.queued_bytes == 0 and pool.cached_bytes == buffer_bytes <= pool.large_limit_bytes

    _endpoint_parts(tmp_path / "data", test, views=False)


def test_a_buffer_an_unsent_response_still_holds_is_not_reused(tmp_path: Path) -> None:
    values = _stored(tmp_path / "data", 2 * BATCH_MESSAGES)

    async def test(broker: Broker, sender: ResponseSender, transport: _UnsentTransport,
                   pool: QueuedRequestBytes) -> None:
        await _send_fetch(broker, sender, 0)  # its batch's buffer stays in the transport, unsent
        await _send_fetch(broker, sender, BATCH_MESSAGES)  # a batch of the same size class, other messages
        first, second = [view.obj for view in transport.unsent if len(view) >= REUSED_BATCH_BYTES_MIN]
        assert first is not second
        assert _batches(transport.send()) == [
            [(offset, values[offset]) for offset in range(start, start + BATCH_MESSAGES)]
            for start in (0, BATCH_MESSAGES)]
        sender.close()
        assert pool.queued_bytes == 0 and pool.cached_bytes == 0  # both were viewed when written: none kept

    _endpoint_parts(tmp_path / "data", test, views=True)


def test_the_layout_sizing_computed_is_kept_for_the_encoding(tmp_path: Path) -> None:
    values = _stored(tmp_path / "data", BATCH_MESSAGES)

    async def test(broker: Broker, sender: ResponseSender, transport: _UnsentTransport,
                   pool: QueuedRequestBytes) -> None:
        response = await handle_fetch(broker, fetch_request("t", max_bytes=FETCH_BYTES), 11)
        [[_, [answer]]] = response.topics
        [piece] = answer.batches
        with Store.open(tmp_path / "data") as store:
            laid_out = record_layout(store.read("t", 0).to_batches()[0])
        assert laid_out.batch_bytes == piece.size
        assert pool.cached_bytes == laid_out.held_bytes  # kept in the pool's free room since sizing
        await sender.send(response.framed(1))
        assert _batches(transport.send()) == [[(offset, values[offset]) for offset in range(BATCH_MESSAGES)]]
        assert pool.cached_bytes == BatchBuffers.charge(piece.size)  # the layout went to the encoding; the buffer
        sender.close()  # is free for the next batch

    _endpoint_parts(tmp_path / "data", test, views=False)


def test_layouts_take_only_free_room_at_most_their_bound_and_go_when_room_is_needed() -> None:
    async def scenario() -> None:
        pool = QueuedRequestBytes(64 * MiB)
        layouts = BatchLayouts()
        layouts.count_in(pool)
        layout = record_layout(_batch(20_000, general=False))  # a layout of about 3 MiB
        for number in range(5):
            layouts.keep(number, layout)
        assert layouts.size_bytes == pool.cached_bytes <= LAYOUTS_BYTES_MAX < layouts.size_bytes + layout.held_bytes
        assert layouts.take(0) is None and layouts.take(4) is layout and layouts.take(4) is None  # oldest went first
        await pool.reserve(pool.large_limit_bytes - layout.held_bytes // 2)  # a request needs the room: dropped
        assert layouts.size_bytes == pool.cached_bytes == 0
        layouts.keep(5, layout)  # no free room: not kept
        assert layouts.size_bytes == 0 and layouts.take(5) is None

    asyncio.run(scenario())


def test_kafka_python_reads_every_message_while_fetch_buffers_are_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = np.random.default_rng(19)
    messages = [(b"k%d" % index, rng.bytes(int(size))) for index, size in enumerate(rng.integers(0, 3000, 4000))]
    with Store.open(data) as store:
        store.create_topic("t", partitions=1)
        for start in range(0, len(messages), 700):  # stored batches that fetches start inside of
            store.append("t", messages[start : start + 700], partition=0)
    options = EndpointOptions(port=0, fetch_cache_bytes=1)  # no batch cached: every buffer goes back when written
    with KafkaEndpoint(data, options=options) as endpoint:
        consumed = consumed_from_start(f"127.0.0.1:{endpoint.port}", "t", len(messages))
        assert endpoint._queued.cached_bytes >= REUSED_BATCH_BYTES_MIN  # free batch buffers kept for reuse
    assert consumed == [(offset, key, value) for offset, (key, value) in enumerate(messages)]
