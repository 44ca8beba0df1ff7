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
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

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
