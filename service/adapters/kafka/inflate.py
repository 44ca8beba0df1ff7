"""A compressed record batch's bytes, inflated a bounded piece at a time.

aiokafka inflates a compressed batch whole before reading its first record, so a batch of 100 KB that
inflates to 100 MB is held whole (ten of them took a worker past 1.3 GB). Here every codec Kafka
defines is read as a stream: `Inflated.read(n)` never returns more than `n` bytes, and what the stream
holds besides is one codec block (LZ4: at most 4 MiB by its frame format; snappy: one block, whose
stated size is checked before it is inflated; gzip and zstd: their own windows).
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable, Iterator

import cramjam
import lz4.frame
import zstandard

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CODECS = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
# The header Java's (xerial) snappy framing starts with; without it a batch is one raw snappy block.
_XERIAL = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16


class UnknownCodec(ValueError):
    """The batch's attributes name a codec Kafka does not define."""


class TooLarge(ValueError):
    """A block states an inflated size past what may be held at once."""


class Inflated:
    """The inflated bytes of one batch's records section, read forward only."""

    def __init__(self, chunks: Callable[[int], bytes]) -> None:
        self._chunks = chunks  # up to n more inflated bytes; b"" once the stream ends
        self._buffer = bytearray()
        self.produced = 0  # inflated bytes read or skipped so far

    def read(self, n: int) -> bytes:
        """Up to `n` bytes (fewer only at the end of the stream)."""
        while len(self._buffer) < n:
            chunk = self._chunks(n - len(self._buffer))
            if not chunk:
                break
            self._buffer += chunk
        taken = bytes(self._buffer[:n])
        del self._buffer[:n]
        self.produced += len(taken)
        return taken

    def skip(self, n: int, piece: int = 256 * 1024) -> int:
        """Inflate and drop `n` bytes, a piece at a time; returns how many there were."""
        skipped = 0
        while skipped < n:
            got = len(self.read(min(piece, n - skipped)))
            if not got:
                break
            skipped += got
        return skipped


def inflate(codec: int, data: memoryview, max_block: int) -> Inflated:
    """The stream of `data` compressed with `codec`; a snappy block stating more than `max_block`
    inflated bytes raises `TooLarge` when it is reached."""
    if codec == GZIP:
        return Inflated(_Gzip(data))
    if codec == LZ4:
        return Inflated(_Lz4(data))
    if codec == ZSTD:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        return Inflated(reader.read)
    if codec == SNAPPY:
        return Inflated(_Snappy(data, max_block))
    raise UnknownCodec(f"compression codec {codec} is not one Kafka defines")


class _Gzip:
    """One gzip member after another (Kafka writes one; concatenated members are one stream)."""

    def __init__(self, data: memoryview) -> None:
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input: bytes | memoryview = data

    def __call__(self, n: int) -> bytes:
        while True:
            out = self._inflater.decompress(self._inflater.unconsumed_tail or self._input, n)
            self._input = b""
            if out:
                return out
            if self._inflater.eof and self._inflater.unused_data:
                self._input = self._inflater.unused_data
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                continue
            if not self._inflater.eof:
                raise zlib.error("the gzip stream ends before its end marker")
            return b""


class _Lz4:
    """An LZ4 frame (KIP-57), inflated up to `n` bytes per call."""

    def __init__(self, data: memoryview) -> None:
        self._inflater = lz4.frame.LZ4FrameDecompressor()
        self._input: bytes | memoryview = data

    def __call__(self, n: int) -> bytes:
        if self._inflater.eof:
            return b""
        out: bytes = self._inflater.decompress(self._input, max_length=n)
        self._input = b""
        if not out and not self._inflater.eof and self._inflater.needs_input:
            raise ValueError("the LZ4 frame ends before its end mark")
        return out


class _Snappy:
    """Java's xerial framing (blocks, each with its length), or one raw block. A raw block states its
    inflated size in its first bytes: it is checked before the block is inflated."""

    def __init__(self, data: memoryview, max_block: int) -> None:
        self._max_block = max_block
        if data[:8] == _XERIAL and len(data) > _XERIAL_HEADER:
            self._blocks = _xerial_blocks(data[_XERIAL_HEADER:])
        else:
            self._blocks = iter([data])
        self._current = b""
        self._pos = 0

    def __call__(self, n: int) -> bytes:
        while self._pos >= len(self._current):
            block = next(self._blocks, None)
            if block is None:
                return b""
            size = cramjam.snappy.decompress_raw_len(block)
            if size > self._max_block:
                raise TooLarge(f"a snappy block states {size} inflated bytes, more than {self._max_block}")
            self._current, self._pos = bytes(cramjam.snappy.decompress_raw(block)), 0
        out = self._current[self._pos : self._pos + n]
        self._pos += len(out)
        return out


def _xerial_blocks(data: memoryview) -> Iterator[memoryview]:
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or pos + 4 + size > len(data):
            raise ValueError(f"a snappy block of {size} bytes runs past the batch")
        yield data[pos + 4 : pos + 4 + size]
        pos += 4 + size
