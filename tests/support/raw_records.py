"""Kafka records with bytes no ordinary client writes: header keys that are not UTF-8.

aiokafka's producer encodes header keys as UTF-8; a `RawKey` is a `str` whose `encode` gives the bytes
it was made from, and the pure-Python batch builder (which calls `encode`) writes them as they are.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any

import aiokafka.producer.message_accumulator as accumulator
import aiokafka.producer.producer as producer
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy, _DefaultRecordBatchPy
from aiokafka.record.util import calc_crc32c

Header = tuple[bytes, bytes | None]


class RawKey(str):
    raw: bytes

    def __new__(cls, raw: bytes) -> RawKey:
        made = super().__new__(cls, raw.decode("latin-1"))
        made.raw = raw
        return made

    def encode(self, *_args: Any, **_kwargs: Any) -> bytes:  # type: ignore[override]
        return self.raw


def raw_headers(headers: list[Header]) -> list[tuple[str, bytes | None]]:
    return [(RawKey(k), v) for k, v in headers]


def raw_batch(
    records: list[tuple[bytes | None, bytes | None, list[Header]]],
    base_offset: int = 0,
    compression: int = 0,
) -> bytes:
    """One v2 record batch as a broker would return it, its records at base_offset, base_offset+1, …"""
    builder = _DefaultRecordBatchBuilderPy(2, compression, 0, -1, -1, -1, 2**30)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=raw_headers(headers))
    data = builder.build()
    struct.pack_into(">q", data, 0, base_offset)  # outside the CRC, which starts at the attributes
    return bytes(data)


@contextlib.contextmanager
def raw_key_producers() -> Iterator[None]:
    """aiokafka producers write `RawKey` header keys as their bytes inside this block."""
    modules = (accumulator, producer)
    originals = [module.DefaultRecordBatchBuilder for module in modules]
    for module in modules:
        module.DefaultRecordBatchBuilder = _DefaultRecordBatchBuilderPy  # type: ignore[misc]
    try:
        yield
    finally:
        for module, original in zip(modules, originals, strict=True):
            module.DefaultRecordBatchBuilder = original  # type: ignore[misc]


def with_crc(data: bytearray) -> bytes:
    """The batch's CRC made right again after its bytes were changed on purpose."""
    attributes = _DefaultRecordBatchPy.ATTRIBUTES_OFFSET
    struct.pack_into(">I", data, _DefaultRecordBatchPy.CRC_OFFSET, calc_crc32c(bytes(data[attributes:])))
    return bytes(data)


async def send_raw_batch(bootstrap: str, topic: str, partition: int, data: bytes) -> int:
    """Publish these exact batch bytes (a broker that does not validate batches stores them as they
    are, as Tansu does); returns the batch's base offset."""
    original = accumulator.BatchBuilder._build

    def build(builder: Any) -> bytearray:
        builder.close()
        builder._buffer = bytearray(data)
        return builder._buffer  # type: ignore[no-any-return]

    accumulator.BatchBuilder._build = build  # type: ignore[method-assign]
    sender = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=0)
    await sender.start()
    try:
        metadata = await sender.send_and_wait(topic, b"replaced", partition=partition)
    finally:
        accumulator.BatchBuilder._build = original  # type: ignore[method-assign]
        await sender.stop()
    return int(metadata.offset)
