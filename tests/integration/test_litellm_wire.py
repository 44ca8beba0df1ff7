"""What goes over the wire, captured by the scripted server: the service's own requests for an
OpenAI-compatible model are byte for byte what `litellm.acompletion` sends for the same call, with
the same configuration-derived headers; reasoning models get the parameters they take; a model with
another wire format (Anthropic's messages API) is translated by litellm both ways."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from service.adapters.litellm_requests import cache_marked
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

litellm = import_litellm()
SHAPE = AnswerShape("memories", ANSWER_SCHEMA, max_tokens=321)
REASONING_TOKENS = 1000
MESSAGES = [
    {"role": "system", "content": '提取规则 "引号" 与换行\n第二行'},
    {"role": "user", "content": "wire-marker 请记住:报告用中文写 \u2028 emoji 👍"},
]
ANSWER = '{"memories": [{"type": "user", "content": "报告用中文写"}]}'
# litellm keeps one OpenAI SDK client per key and configuration: a fresh key per call keeps a
# client built under another test's configuration out of the comparison.
_keys = (f"wire-key-{n}" for n in itertools.count())


@pytest.fixture
async def clients() -> AsyncIterator[list[LlmClient]]:
    made: list[LlmClient] = []
    yield made
    for client in made:
        await client.stop()


async def via_service(
    clients: list[LlmClient],
    base: str,
    model: str,
    mode: StructuredOutput,
    llm: ScriptedLlm,
    effort: str | None = None,
) -> tuple[Request, str, Metrics]:
    metrics = Metrics()
    client = LlmClient(
        metrics,
        base,
        next(_keys),
        5,
        0,
        0.01,
        structured_output=mode,
        reasoning_effort=effort,
        reasoning_tokens=REASONING_TOKENS,
    )
    clients.append(client)
    answer = await client.complete("extraction", model, MESSAGES, SHAPE)
    return llm.requests[-1], answer.text, metrics


async def via_litellm(
    base: str, model: str, mode: StructuredOutput, llm: ScriptedLlm, **params: Any
) -> Request:
    """`acompletion` asked for the same call: temperature 0 and the answer cap unless told otherwise;
    for Anthropic, the prompt prefix marked for its cache as the service marks it."""
    fmt = response_format(mode, SHAPE)
    extra = {"response_format": fmt} if fmt is not None else {}
    params = {"temperature": 0, "max_tokens": SHAPE.max_tokens} | params
    await litellm.acompletion(
        model=model,
        messages=cache_marked(MESSAGES) if model.startswith("anthropic/") else MESSAGES,
        api_base=base,
        api_key=next(_keys),
        timeout=5,
        num_retries=0,
        **params,
        **extra,
    )
    return llm.requests[-1]


def configured_headers(request: Request) -> dict[str, str]:
    """The headers a configuration decides: the OpenAI SDK's description of itself (user agent,
    x-stainless-*) and the connection's own (host, length, encoding) are not among them."""
    own = {"user-agent", "host", "content-length", "accept-encoding", "connection"}
    return {
        name: value
        for name, value in request.headers.items()
        if name not in own and not name.startswith("x-stainless-")
    }


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
    assert mine.headers["authorization"].startswith("Bearer wire-key-")
    assert configured_headers(mine).keys() == configured_headers(theirs).keys()
    assert mine.headers["content-type"] == "application/json" and text == '{"memories": []}'


@pytest.mark.parametrize("suffix", ["?tenant=a", "/chat/completions", "/chat/completions/", "#part"])
async def test_an_api_base_litellm_builds_its_own_way_goes_through_acompletion(
    llm: ScriptedLlm, clients: list[LlmClient], suffix: str
) -> None:
    """litellm puts a query before its path, appends to a base already ending in the path, and
    drops a fragment: whatever it makes of such a base, the request is the one it would send."""
    llm.script("wire-marker", '{"memories": []}')
    base = llm.api_base + suffix
    mine, text, _ = await via_service(clients, base, "openai/scripted-wire", StructuredOutput.OFF, llm)
    theirs = await via_litellm(base, "openai/scripted-wire", StructuredOutput.OFF, llm)

    assert (mine.path, mine.raw) == (theirs.path, theirs.raw)
    assert text == '{"memories": []}'


def _set(target: Any, name: str, value: Any) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda patch: patch.setattr(target, name, value)


def _env(name: str, value: str) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda patch: patch.setenv(name, value)


# Each setting litellm or the OpenAI SDK reads, and the headers it must put on the request (an API
# version means nothing to OpenAI's chat API: nothing is added).
CONFIGURATIONS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], dict[str, str]]] = {
    "litellm.organization": (
        _set(litellm, "organization", "org-from-litellm"),
        {"openai-organization": "org-from-litellm"},
    ),
    "OPENAI_ORGANIZATION": (
        _env("OPENAI_ORGANIZATION", "org-from-litellm-env"),
        {"openai-organization": "org-from-litellm-env"},
    ),
    "OPENAI_ORG_ID": (_env("OPENAI_ORG_ID", "org-from-sdk-env"), {"openai-organization": "org-from-sdk-env"}),
    "OPENAI_PROJECT_ID": (
        _env("OPENAI_PROJECT_ID", "proj-from-sdk-env"),
        {"openai-project": "proj-from-sdk-env"},
    ),
    "litellm.headers": (
        _set(litellm, "headers", {"X-Gateway-Tenant": "memory", "Accept": "application/json"}),
        {"x-gateway-tenant": "memory"},
    ),
    "litellm.api_version": (_set(litellm, "api_version", "2024-10-21"), {}),
    "OPENAI_API_VERSION": (_env("OPENAI_API_VERSION", "2024-10-21"), {}),
    "OPENAI_CUSTOM_HEADERS": (
        _env("OPENAI_CUSTOM_HEADERS", "X-Team: memory\nX-Cost-Centre: 42"),
        {"x-team": "memory", "x-cost-centre": "42"},
    ),
}


@pytest.mark.parametrize(("configure", "expected"), CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
async def test_headers_from_the_configuration_are_what_litellm_would_send(
    llm: ScriptedLlm,
    clients: list[LlmClient],
    monkeypatch: pytest.MonkeyPatch,
    configure: Callable[[pytest.MonkeyPatch], None],
    expected: dict[str, str],
) -> None:
    """Sent alike, or the call goes through `acompletion` itself."""
    configure(monkeypatch)
    llm.script("wire-marker", '{"memories": []}')
    mine, text, _ = await via_service(
        clients, llm.api_base, "openai/scripted-wire", StructuredOutput.OFF, llm
    )
    theirs = await via_litellm(llm.api_base, "openai/scripted-wire", StructuredOutput.OFF, llm)

    assert mine.raw == theirs.raw and mine.path == theirs.path
    mine_headers, their_headers = configured_headers(mine), configured_headers(theirs)
    assert mine_headers.pop("authorization") != their_headers.pop("authorization")  # two keys
    assert mine_headers == their_headers
    assert expected.items() <= mine_headers.items()
    assert text == '{"memories": []}'


@pytest.mark.parametrize(
    ("model", "effort", "sent_effort"),
    [
        ("openai/gpt-5-mini", None, "minimal"),
        ("openai/gpt-5-nano", None, "minimal"),
        ("openai/o4-mini", None, "low"),
        ("openai/gpt-5-mini", "low", "low"),
    ],
)
@pytest.mark.parametrize("path", ["service", "acompletion"])
async def test_a_reasoning_model_gets_what_it_takes_and_its_answer_parses(
    llm: ScriptedLlm,
    clients: list[LlmClient],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    effort: str | None,
    sent_effort: str,
    path: str,
) -> None:
    """No temperature 0 (refused by these models), the lowest effort (or the configured one), and
    the answer cap plus room for hidden reasoning, sent as max_completion_tokens; on the service's
    own path and through `acompletion` (a configuration the own path does not reproduce)."""
    if path == "acompletion":
        monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "X-Team: memory")
    llm.script("wire-marker", ANSWER)
    mode = StructuredOutput.JSON_SCHEMA
    mine, text, _ = await via_service(clients, llm.api_base, model, mode, llm, effort=effort)
    theirs = await via_litellm(
        llm.api_base,
        model,
        mode,
        llm,
        temperature=None,
        max_tokens=SHAPE.max_tokens + REASONING_TOKENS,
        reasoning_effort=sent_effort,
    )

    assert mine.raw == theirs.raw
    assert "temperature" not in mine.body and "max_tokens" not in mine.body
    assert mine.body["max_completion_tokens"] == SHAPE.max_tokens + REASONING_TOKENS
    assert mine.body["reasoning_effort"] == sent_effort
    assert mine.body["response_format"]["type"] == "json_schema"
    assert text == ANSWER


@pytest.mark.parametrize("path", ["service", "acompletion"])
async def test_a_model_able_to_reason_that_takes_temperature_gets_room_but_no_effort(
    llm: ScriptedLlm, clients: list[LlmClient], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """gpt-5.1 (like Gemini 2.5, which thinks unless told not to) takes temperature 0; litellm's map
    says it can reason, not whether it does by default: it gets the room, not an effort."""
    if path == "acompletion":
        monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "X-Team: memory")
    llm.script("wire-marker", ANSWER)
    mode = StructuredOutput.JSON_SCHEMA
    mine, text, _ = await via_service(clients, llm.api_base, "openai/gpt-5.1", mode, llm, effort="low")
    theirs = await via_litellm(
        llm.api_base, "openai/gpt-5.1", mode, llm, max_tokens=SHAPE.max_tokens + REASONING_TOKENS
    )

    assert mine.raw == theirs.raw
    assert mine.body["temperature"] == 0 and "reasoning_effort" not in mine.body
    assert mine.body["max_completion_tokens"] == SHAPE.max_tokens + REASONING_TOKENS
    assert text == ANSWER


@pytest.mark.parametrize(
    ("model", "room"),
    [
        ("anthropic/claude-3-5-haiku-20241022", 0),  # not in litellm's map
        ("anthropic/claude-sonnet-4-20250514", REASONING_TOKENS),  # able to think: not made to
    ],
)
async def test_an_anthropic_model_is_translated_by_litellm_both_ways(
    llm: ScriptedLlm, clients: list[LlmClient], model: str, room: int
) -> None:
    base = llm.api_base.removesuffix("/v1")  # litellm appends /v1/messages
    llm.script("wire-marker", ANSWER)
    mine, text, metrics = await via_service(clients, base, model, StructuredOutput.OFF, llm, effort="low")
    theirs = await via_litellm(base, model, StructuredOutput.OFF, llm, max_tokens=SHAPE.max_tokens + room)

    assert mine.path == "/v1/messages" and mine.raw == theirs.raw
    assert mine.body["system"][0]["text"] == MESSAGES[0]["content"]  # Anthropic's shape, not OpenAI's
    assert mine.body["temperature"] == 0 and mine.body["max_tokens"] == SHAPE.max_tokens + room
    assert "thinking" not in mine.body
    assert text == ANSWER
    assert metrics.llm_tokens.labels("extraction", "prompt")._value.get() == 100
    assert metrics.llm_tokens.labels("extraction", "completion")._value.get() == 20
