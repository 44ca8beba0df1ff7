"""Prompt tokens a provider served from its prompt cache, or wrote to it, are counted per purpose and
priced at the cache rates of litellm's cost map, on the shared session and through acompletion."""

from __future__ import annotations

import json

import pytest

from service.adapters.llm_client import AnswerShape, LlmClient, StructuredOutput, import_litellm
from service.adapters.metrics import Metrics
from tests.support.scripted_llm import ScriptedLlm

SHAPE = AnswerShape("memories", {"type": "object"}, 256)


def completion(usage: dict[str, object]) -> bytes:
    message = {"role": "assistant", "content": '{"memories": []}'}
    return json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
    ).encode()


def anthropic_message(usage: dict[str, object]) -> bytes:
    return json.dumps(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "content": [{"type": "text", "text": '{"memories": []}'}],
            "usage": usage,
        }
    ).encode()


def rates(model: str) -> dict[str, float]:
    info = import_litellm().get_model_info(model=model)
    return {
        "prompt": info["input_cost_per_token"],
        "completion": info["output_cost_per_token"],
        "read": info["cache_read_input_token_cost"],
        "write": info.get("cache_creation_input_token_cost") or info["input_cost_per_token"],
    }


@pytest.mark.parametrize(
    ("model", "body", "read", "written"),
    [
        # OpenAI: the cached part of prompt_tokens in its details
        (
            "openai/gpt-4o-mini",
            completion(
                {
                    "prompt_tokens": 1000,
                    "completion_tokens": 20,
                    "prompt_tokens_details": {"cached_tokens": 800},
                }
            ),
            800,
            0,
        ),
        # Anthropic: cache reads and writes beside the uncached input, which litellm adds up
        (
            "anthropic/claude-sonnet-4-5",
            anthropic_message(
                {
                    "input_tokens": 100,
                    "output_tokens": 20,
                    "cache_read_input_tokens": 700,
                    "cache_creation_input_tokens": 200,
                }
            ),
            700,
            200,
        ),
    ],
)
async def test_cached_prompt_tokens_are_counted_and_priced_at_the_cache_rates(
    llm: ScriptedLlm, model: str, body: bytes, read: int, written: int
) -> None:
    metrics = Metrics()
    base = llm.api_base if model.startswith("openai/") else llm.api_base.removesuffix("/v1")
    client = LlmClient(
        metrics,
        base,
        "k",
        timeout_s=5,
        max_retries=0,
        retry_base_s=0.01,
        structured_output=StructuredOutput.OFF,
    )
    llm.script("cache-marker", raw_body=body)
    try:
        await client.complete("extraction", model, [{"role": "user", "content": "cache-marker"}], SHAPE)
    finally:
        await client.stop()

    value = metrics.registry.get_sample_value
    tokens = {
        kind: value("mao_memory_llm_tokens_total", {"purpose": "extraction", "kind": kind})
        for kind in ("prompt", "completion", "cache_read", "cache_write")
    }
    assert tokens == {"prompt": 1000, "completion": 20, "cache_read": read, "cache_write": written}
    price = rates(model)
    expected = (
        (1000 - read - written) * price["prompt"]
        + read * price["read"]
        + written * price["write"]
        + 20 * price["completion"]
    )
    assert value("mao_memory_llm_cost_usd_total", {"purpose": "extraction"}) == pytest.approx(expected)
    assert price["read"] < price["prompt"]  # the rates differ, so the figure shows which was used


async def test_an_anthropic_request_marks_the_rules_and_the_memories_for_the_cache(llm: ScriptedLlm) -> None:
    """Anthropic caches only a marked prefix: the system rules and the user message up to its last
    block (the conversation) carry `cache_control`; an OpenAI request, cached by prefix, carries none."""
    client = LlmClient(
        Metrics(),
        llm.api_base.removesuffix("/v1"),
        "k",
        timeout_s=5,
        max_retries=0,
        retry_base_s=0.01,
        structured_output=StructuredOutput.OFF,
    )
    memories, conversation = "User memories:\n1\t报告用中文", 'Conversation:\n{"user": "cache-mark"}'
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": f"{memories}\n\n{conversation}"},
    ]
    llm.script("cache-mark", raw_body=anthropic_message({"input_tokens": 10, "output_tokens": 2}))
    try:
        await client.complete("extraction", "anthropic/claude-sonnet-4-5", messages, SHAPE)
    finally:
        await client.stop()

    [request] = llm.calls("cache-mark")
    ephemeral = {"type": "ephemeral"}
    assert request.body["system"] == [{"type": "text", "text": "rules", "cache_control": ephemeral}]
    [user] = request.body["messages"]
    assert user["content"] == [
        {"type": "text", "text": memories, "cache_control": ephemeral},
        {"type": "text", "text": f"\n\n{conversation}"},
    ]


async def test_an_openai_request_carries_no_cache_marks(llm: ScriptedLlm) -> None:
    client = LlmClient(
        Metrics(),
        llm.api_base,
        "k",
        timeout_s=5,
        max_retries=0,
        retry_base_s=0.01,
        structured_output=StructuredOutput.OFF,
    )
    llm.script("plain-mark", raw_body=completion({"prompt_tokens": 10, "completion_tokens": 2}))
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "a\n\nplain-mark"}]
    try:
        await client.complete("extraction", "openai/gpt-4o-mini", messages, SHAPE)
    finally:
        await client.stop()
    [request] = llm.calls("plain-mark")
    assert request.body["messages"] == messages
