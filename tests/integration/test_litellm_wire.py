"""What goes over the wire, captured by the scripted server: the service's own requests for an
OpenAI-compatible model are byte for byte what `litellm.acompletion` sends for the same call, and a
model with another wire format (Anthropic's messages API) is translated by litellm both ways."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.adapters.llm_client import (
    AnswerShape,
    LlmClient,
    StructuredOutput,
    import_litellm,
    response_format,
)
from service.adapters.metrics import Metrics
from service.core.extraction_prompt import ANSWER_SCHEMA
from tests.support.scripted_llm import Request, ScriptedLlm

SHAPE = AnswerShape("memories", ANSWER_SCHEMA, max_tokens=321)
MESSAGES = [
    {"role": "system", "content": '提取规则 "引号" 与换行\n第二行'},
    {"role": "user", "content": "wire-marker 请记住:报告用中文写 \u2028 emoji 👍"},
]


@pytest.fixture
async def clients() -> AsyncIterator[list[LlmClient]]:
    made: list[LlmClient] = []
    yield made
    for client in made:
        await client.stop()


async def via_service(
    clients: list[LlmClient], base: str, model: str, mode: StructuredOutput, llm: ScriptedLlm
) -> tuple[Request, str, Metrics]:
    metrics = Metrics()
    client = LlmClient(metrics, base, "wire-key", 5, 0, 0.01, structured_output=mode)
    clients.append(client)
    answer = await client.complete("extraction", model, MESSAGES, SHAPE)
    return llm.requests[-1], answer.text, metrics


async def via_litellm(base: str, model: str, mode: StructuredOutput, llm: ScriptedLlm) -> Request:
    fmt = response_format(mode, SHAPE)
    extra = {"response_format": fmt} if fmt is not None else {}
    await import_litellm().acompletion(
        model=model,
        messages=MESSAGES,
        api_base=base,
        api_key="wire-key",
        timeout=5,
        num_retries=0,
        temperature=0,
        max_tokens=SHAPE.max_tokens,
        **extra,
    )
    return llm.requests[-1]


@pytest.mark.parametrize(
    "mode", [StructuredOutput.JSON_SCHEMA, StructuredOutput.JSON_OBJECT, StructuredOutput.OFF]
)
async def test_an_openai_compatible_request_is_what_litellm_would_send(
    llm: ScriptedLlm, clients: list[LlmClient], mode: StructuredOutput
) -> None:
    llm.script("wire-marker", '{"memories": []}')
    mine, text, _ = await via_service(clients, llm.api_base, "openai/scripted-wire", mode, llm)
    theirs = await via_litellm(llm.api_base, "openai/scripted-wire", mode, llm)

    assert mine.raw == theirs.raw
    assert mine.path == theirs.path == "/v1/chat/completions"
    assert mine.headers["authorization"] == theirs.headers["authorization"] == "Bearer wire-key"
    assert mine.headers["content-type"] == "application/json" and text == '{"memories": []}'


async def test_an_anthropic_model_is_translated_by_litellm_both_ways(
    llm: ScriptedLlm, clients: list[LlmClient]
) -> None:
    base = llm.api_base.removesuffix("/v1")  # litellm appends /v1/messages
    model = "anthropic/claude-3-5-haiku-20241022"
    llm.script("wire-marker", '{"memories": [{"type": "user", "content": "报告用中文写"}]}')
    mine, text, metrics = await via_service(clients, base, model, StructuredOutput.OFF, llm)
    theirs = await via_litellm(base, model, StructuredOutput.OFF, llm)

    assert mine.path == "/v1/messages" and mine.raw == theirs.raw
    assert mine.body["system"][0]["text"] == MESSAGES[0]["content"]  # Anthropic's shape, not OpenAI's
    assert text == '{"memories": [{"type": "user", "content": "报告用中文写"}]}'
    assert metrics.llm_tokens.labels("extraction", "prompt")._value.get() == 100
    assert metrics.llm_tokens.labels("extraction", "completion")._value.get() == 20
