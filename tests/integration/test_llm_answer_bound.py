"""A model's answer is read up to a stated size, decompressed as it arrives: a gzip bomb from a
provider or a gateway on the path is an event failure of its own kind, never inflated whole."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib

import pytest

from service.adapters.llm_client import ANSWER_BASE_BYTES, FailureClass, LlmError
from service.adapters.metrics import Metrics
from tests.integration.test_llm_client import OPENAI, SHAPE, client
from tests.support.scripted_llm import ScriptedLlm

MESSAGES = [{"role": "system", "content": "rules"}, {"role": "user", "content": "bomb"}]


def gzip_bomb(inflated_mb: int) -> bytes:
    """A completion whose content is `inflated_mb` MB of one letter, gzip-compressed piecewise so the
    test never holds it whole either (about 1,000:1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
    parts = [packer.compress(head + b'{"role": "assistant", "content": "')]
    block = b"a" * (1024 * 1024)
    parts += [packer.compress(block) for _ in range(inflated_mb)]
    parts.append(packer.compress(b'"}, "finish_reason": "stop"}]}') + packer.flush())
    return b"".join(parts)


async def test_a_gzip_bomb_answer_fails_the_call_without_being_inflated(llm: ScriptedLlm) -> None:
    bomb = gzip_bomb(200)
    assert len(bomb) < 400 * 1024
    llm.script("bomb", raw_body=bomb, headers={"Content-Encoding": "gzip"})
    metrics = Metrics()
    model = client(llm, metrics)

    tracemalloc.start()
    try:
        with pytest.raises(LlmError) as failed:
            await model.complete("extraction", OPENAI, MESSAGES, SHAPE)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (failed.value.kind, failed.value.failure) == ("oversize", FailureClass.EVENT)
    assert peak < 8 * 1024 * 1024, peak  # 200 MB inflated whole before the bound
    assert metrics.llm_calls.labels("extraction", "oversize")._value.get() == 1


async def test_an_answer_over_the_bound_fails_uncompressed_too(llm: ScriptedLlm) -> None:
    content = "a" * (2 * 1024 * 1024)
    body = json.dumps(
        {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    )
    llm.script("bomb", raw_body=body.encode())
    with pytest.raises(LlmError) as failed:
        await client(llm, Metrics()).complete("extraction", OPENAI, MESSAGES, SHAPE)
    assert failed.value.kind == "oversize"


async def test_a_compressed_answer_within_the_bound_is_read(llm: ScriptedLlm) -> None:
    """The longest answer the cap allows, in CJK escaped as JSON, fits with room to spare."""
    content = json.dumps([{"type": "user", "content": "偏" * 120}] * 3)
    body = json.dumps(
        {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]},
        ensure_ascii=True,
    ).encode()
    assert len(body) < ANSWER_BASE_BYTES
    llm.script("bomb", raw_body=gzip.compress(body), headers={"Content-Encoding": "gzip"})
    answer = await client(llm, Metrics()).complete("extraction", OPENAI, MESSAGES, SHAPE)
    assert json.loads(answer.text) == json.loads(content)
