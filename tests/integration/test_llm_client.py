"""The model boundary against the scripted OpenAI-compatible server, through the real litellm path:
what each structured-output mode sends, the fallback when a provider refuses one, the token cap,
the circuit breaker, and the cost and size metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker
from service.adapters.llm_client import AnswerShape, LlmClient, LlmError, StructuredOutput
from service.adapters.metrics import Metrics
from service.core.extraction_prompt import ANSWER_SCHEMA
from tests.support.scripted_llm import ScriptedLlm

SHAPE = AnswerShape("memories", ANSWER_SCHEMA, max_tokens=777)


MADE: list[LlmClient] = []


@pytest.fixture(autouse=True)
async def _stop_clients() -> AsyncIterator[None]:
    """Each client's HTTP session is closed after its test, as the service closes it at shutdown."""
    yield
    while MADE:
        await MADE.pop().stop()


def client(
    llm: ScriptedLlm,
    metrics: Metrics,
    mode: StructuredOutput = StructuredOutput.AUTO,
    breaker: CircuitBreaker | None = None,
) -> LlmClient:
    """No API key: a local server needs none, and the client must still send the call."""
    made = LlmClient(
        metrics,
        llm.api_base,
        None,
        timeout_s=5,
        max_retries=2,
        retry_base_s=0.01,
        breaker=breaker,
        structured_output=mode,
    )
    MADE.append(made)
    return made


def messages(marker: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "rules"}, {"role": "user", "content": marker}]


@pytest.mark.parametrize(
    ("model", "mode", "expected"),
    [
        ("openai/gpt-4o-mini", StructuredOutput.AUTO, "json_schema"),  # litellm: takes a JSON schema
        ("openai/local-model", StructuredOutput.AUTO, "json_object"),  # unknown: JSON mode
        ("openai/gpt-4o-mini", StructuredOutput.JSON_OBJECT, "json_object"),
        ("openai/gpt-4o-mini", StructuredOutput.OFF, None),
    ],
)
async def test_each_mode_sends_its_response_format_and_a_token_cap(
    llm: ScriptedLlm, model: str, mode: StructuredOutput, expected: str | None
) -> None:
    llm.script("marker-a", {"memories": []})
    answer = await client(llm, Metrics(), mode).complete("extraction", model, messages("marker-a"), SHAPE)
    [call] = llm.calls("marker-a")
    assert answer.text == '{"memories": []}'
    assert call.body["max_tokens"] == 777
    sent = call.body.get("response_format")
    assert (sent or {}).get("type") == expected
    if expected == "json_schema":
        schema = sent["json_schema"]
        assert schema["strict"] is True and schema["name"] == "memories"
        assert schema["schema"]["required"] == ["memories"]
        assert "maxLength" not in str(schema)  # a provider enforcing it would cut facts mid-sentence


async def test_a_500_to_a_json_schema_falls_back_once_per_model_not_per_event(llm: ScriptedLlm) -> None:
    """llama.cpp's server answers a JSON-schema request with 500: one fallback, then JSON mode."""
    metrics = Metrics()
    llm.script("marker-b", status=500, times=1)  # the schema request
    llm.script("marker-b", {"memories": []})
    llm_client = client(llm, metrics)

    for _ in range(3):
        await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-b"), SHAPE)

    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-b")]
    assert sent == ["json_schema", "json_object", "json_object", "json_object"]
    assert llm_client.mode("openai/gpt-4o-mini") is StructuredOutput.JSON_OBJECT
    fallbacks = metrics.registry.get_sample_value(
        "mao_memory_llm_structured_output_fallbacks_total",
        {"from_mode": "json_schema", "to_mode": "json_object"},
    )
    assert fallbacks == 1


async def test_an_outage_on_the_first_call_is_not_taken_for_a_refused_mode(llm: ScriptedLlm) -> None:
    llm.script("marker-c", status=503)
    llm_client = client(llm, Metrics())
    with pytest.raises(LlmError) as failed:
        await llm_client.complete("extraction", "openai/local-model", messages("marker-c"), SHAPE)
    assert failed.value.retryable and failed.value.status == 503
    assert llm_client.mode("openai/local-model") is StructuredOutput.JSON_OBJECT  # not downgraded
    assert len(llm.calls("marker-c")) == 3  # JSON mode's 5xx is retried as usual


async def test_a_rejection_carries_the_providers_status_and_is_not_retried(llm: ScriptedLlm) -> None:
    llm.script("marker-d", status=400)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF)
    with pytest.raises(LlmError) as rejected:
        await llm_client.complete("extraction", "openai/local-model", messages("marker-d"), SHAPE)
    assert (rejected.value.kind, rejected.value.retryable, rejected.value.status) == ("rejected", False, 400)
    assert "HTTP 400" in rejected.value.detail and len(llm.calls("marker-d")) == 1


async def test_the_breaker_opens_after_consecutive_failures_and_one_probe_closes_it(llm: ScriptedLlm) -> None:
    metrics = Metrics()
    states: list[BreakerState] = []
    breaker = CircuitBreaker(threshold=3, open_s=0.5, max_open_s=2, on_change=states.append)
    llm_client = client(llm, metrics, StructuredOutput.OFF, breaker=breaker)
    llm.script("marker-e", status=503, times=9)  # three failed calls of three tries each
    llm.script("marker-e", [])
    for _ in range(3):
        with pytest.raises(LlmError):
            await llm_client.complete("extraction", "openai/local-model", messages("marker-e"), SHAPE)
    assert breaker.state is BreakerState.OPEN and len(llm.calls("marker-e")) == 9

    with pytest.raises(LlmError, match="unavailable"):  # consolidation does not wait
        await llm_client.complete(
            "consolidation", "openai/local-model", messages("marker-e"), SHAPE, wait=False
        )
    waiting = [
        asyncio.create_task(
            llm_client.complete("extraction", "openai/local-model", messages("marker-e"), SHAPE)
        )
        for _ in range(5)
    ]
    await asyncio.sleep(0.2)
    assert len(llm.calls("marker-e")) == 9  # nothing goes out while open
    await asyncio.gather(*waiting)

    assert len(llm.calls("marker-e")) == 9 + 5  # one probe, then the rest once it closed
    assert states == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


async def test_a_failed_probe_opens_the_breaker_for_twice_as_long(llm: ScriptedLlm) -> None:
    breaker = CircuitBreaker(threshold=1, open_s=0.2, max_open_s=0.3)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker)
    llm.script("marker-f", status=503)
    loop = asyncio.get_running_loop()
    with pytest.raises(LlmError):
        await llm_client.complete("extraction", "openai/local-model", messages("marker-f"), SHAPE)
    started = loop.time()
    with pytest.raises(LlmError):  # waits 0.2 s, probes, fails
        await llm_client.complete("extraction", "openai/local-model", messages("marker-f"), SHAPE)
    assert loop.time() - started >= 0.2
    started = loop.time()
    with pytest.raises(LlmError):  # now 0.3 s (capped)
        await llm_client.complete("extraction", "openai/local-model", messages("marker-f"), SHAPE)
    assert loop.time() - started >= 0.3


async def test_cost_tokens_and_prompt_size_are_counted(llm: ScriptedLlm) -> None:
    metrics = Metrics()
    llm.script("marker-g", {"memories": []})
    await client(llm, metrics).complete("extraction", "openai/gpt-4o-mini", messages("marker-g"), SHAPE)
    value = metrics.registry.get_sample_value
    assert value("mao_memory_llm_tokens_total", {"purpose": "extraction", "kind": "prompt"}) == 100
    assert (value("mao_memory_llm_cost_usd_total", {"purpose": "extraction"}) or 0) > 0  # in litellm's map
    assert value("mao_memory_llm_prompt_chars_sum", {"purpose": "extraction"}) == len("rules") + len(
        "marker-g"
    )
