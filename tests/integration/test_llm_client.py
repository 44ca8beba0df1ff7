"""The model boundary against the scripted server, through the real litellm path: how every answer
shape is classed and retried, what each structured-output mode sends and when it changes, the
circuit breaker counting callers, truncated answers, and the cost and size metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.adapters.circuit_breaker import BreakerState, CircuitBreaker
from service.adapters.llm_client import (
    AnswerShape,
    FailureClass,
    LlmClient,
    LlmError,
    StructuredOutput,
)
from service.adapters.metrics import Metrics
from service.core.extraction_prompt import ANSWER_SCHEMA
from tests.support.processes import free_port
from tests.support.scripted_llm import Request, ScriptedLlm

SHAPE = AnswerShape("memories", ANSWER_SCHEMA, max_tokens=777)
OPENAI = "openai/local-model"  # the service's own HTTP path
ANTHROPIC = "anthropic/claude-haiku-4-5"  # through litellm.acompletion


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
    model: str = OPENAI,
    timeout_s: float = 5,
    max_retries: int = 2,
) -> LlmClient:
    """No API key: a local server needs none, and the client must still send the call."""
    base = llm.api_base.removesuffix("/v1") if model.startswith("anthropic/") else llm.api_base
    made = LlmClient(
        metrics,
        base,
        None,
        timeout_s=timeout_s,
        max_retries=max_retries,
        retry_base_s=0.01,
        breaker=breaker,
        structured_output=mode,
    )
    MADE.append(made)
    return made


def messages(marker: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "rules"}, {"role": "user", "content": marker}]


def schema_requests(request: Request) -> bool:
    return (request.body.get("response_format") or {}).get("type") == "json_schema"


def openai_body(content: Any) -> bytes:
    message = {"role": "assistant", "content": content}
    return json.dumps(
        {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    ).encode()


def anthropic_body(content: Any) -> bytes:
    return json.dumps({"id": "m", "type": "message", "role": "assistant", "content": content}).encode()


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
    assert answer.text == '{"memories": []}' and not answer.truncated
    assert call.body["max_tokens"] == 777 and call.body["temperature"] == 0
    sent = call.body.get("response_format")
    assert (sent or {}).get("type") == expected
    if expected == "json_schema":
        schema = sent["json_schema"]
        assert schema["strict"] is True and schema["name"] == "memories"
        assert schema["schema"]["required"] == ["memories"]
        assert "maxLength" not in str(schema)  # a provider enforcing it would cut facts mid-sentence


# (name, rule for OpenAI's format, rule for Anthropic's, class, kind, requests per call)
SHAPES: list[tuple[str, dict[str, Any], dict[str, Any], FailureClass, str, int]] = [
    ("timeout", {"delay_s": 1.0}, {"delay_s": 1.0}, FailureClass.EVENT, "timeout", 1),
    (
        "2xx without choices",
        {"raw_body": b'{"id": "c", "object": "chat.completion"}'},
        {"raw_body": b'{"id": "m", "type": "message", "role": "assistant"}'},
        FailureClass.EVENT,
        "error",
        1,
    ),
    (
        "content not text",
        {"raw_body": openai_body(5)},
        {"raw_body": anthropic_body([{"type": "text", "text": 5}])},
        FailureClass.EVENT,
        "error",
        1,
    ),
    ("empty body", {"raw_body": b""}, {"raw_body": b""}, FailureClass.EVENT, "error", 1),
    ("not JSON", {"raw_body": b"<html>busy</html>"}, {"raw_body": b"<html>"}, FailureClass.EVENT, "error", 1),
    ("408", {"status": 408}, {"status": 408}, FailureClass.EVENT, "timeout", 1),
    ("409", {"status": 409}, {"status": 409}, FailureClass.EVENT, "error", 1),
    ("425", {"status": 425}, {"status": 425}, FailureClass.EVENT, "error", 1),
    ("429", {"status": 429}, {"status": 429}, FailureClass.OUTAGE, "error", 3),
    ("500", {"status": 500}, {"status": 500}, FailureClass.OUTAGE, "error", 3),
    ("503", {"status": 503}, {"status": 503}, FailureClass.OUTAGE, "error", 3),
    ("connection reset", {"reset": True}, {"reset": True}, FailureClass.OUTAGE, "error", 3),
    ("cut mid-answer", {"truncate": True}, {"truncate": True}, FailureClass.OUTAGE, "error", 3),
    ("400", {"status": 400}, {"status": 400}, FailureClass.REJECTED, "rejected", 1),
    ("401", {"status": 401}, {"status": 401}, FailureClass.REJECTED, "rejected", 1),
    ("404", {"status": 404}, {"status": 404}, FailureClass.REJECTED, "rejected", 1),
    ("422", {"status": 422}, {"status": 422}, FailureClass.REJECTED, "rejected", 1),
]


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize(
    ("name", "openai_rule", "anthropic_rule", "failure", "kind", "requests"),
    SHAPES,
    ids=[shape[0] for shape in SHAPES],
)
async def test_each_failure_is_classed_and_only_an_outage_is_retried(
    llm: ScriptedLlm,
    model: str,
    name: str,
    openai_rule: dict[str, Any],
    anthropic_rule: dict[str, Any],
    failure: FailureClass,
    kind: str,
    requests: int,
) -> None:
    metrics = Metrics()
    llm.script("shape", **(anthropic_rule if model == ANTHROPIC else openai_rule))
    llm_client = client(llm, metrics, StructuredOutput.OFF, model=model, timeout_s=0.5)
    with pytest.raises(LlmError) as failed:
        await llm_client.complete("extraction", model, messages("shape"), SHAPE, caller=name)
    assert (failed.value.failure, failed.value.kind) == (failure, kind), failed.value.detail
    assert failed.value.retryable is (failure is not FailureClass.REJECTED)
    assert len(llm.calls("shape")) == requests
    assert metrics.llm_calls.labels("extraction", kind)._value.get() == 1
    assert llm_client.successes == 0


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_a_refused_connection_is_an_outage_retried_within_the_call(model: str) -> None:
    metrics = Metrics()
    base = f"http://127.0.0.1:{free_port()}" + ("" if model == ANTHROPIC else "/v1")
    llm_client = LlmClient(metrics, base, "k", timeout_s=2, max_retries=2, retry_base_s=0.01)
    MADE.append(llm_client)
    with pytest.raises(LlmError) as failed:
        await llm_client.complete("extraction", model, messages("refused"), SHAPE)
    assert (failed.value.failure, failed.value.kind, failed.value.status) == (
        FailureClass.OUTAGE,
        "error",
        None,
    )
    assert metrics.llm_retries.labels("extraction")._value.get() == 2


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_answer_dripping_a_byte_at_a_time_ends_at_the_calls_timeout(
    llm: ScriptedLlm, model: str
) -> None:
    """Each byte arrives well within any read timeout; the whole answer would take about 30 s."""
    llm.script("drip", '{"memories": []}', drip_s=0.1)
    llm.script("warm", '{"memories": []}')
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, model=model, timeout_s=0.5)
    await llm_client.complete("extraction", model, messages("warm"), SHAPE)  # litellm's first-call setup
    started = asyncio.get_running_loop().time()
    with pytest.raises(LlmError) as failed:
        await asyncio.wait_for(llm_client.complete("extraction", model, messages("drip"), SHAPE), 10)
    assert (failed.value.failure, failed.value.kind) == (FailureClass.EVENT, "timeout")
    assert asyncio.get_running_loop().time() - started < 2
    assert len(llm.calls("drip")) == 1


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_answer_cut_by_the_token_cap_is_reported_as_truncated(llm: ScriptedLlm, model: str) -> None:
    llm.script("cut", '{"memories": [{"type": "user", "content": "半句', finish_reason="length")
    llm.script("whole", '{"memories": []}')
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, model=model)
    cut = await llm_client.complete("extraction", model, messages("cut"), SHAPE)
    whole = await llm_client.complete("extraction", model, messages("whole"), SHAPE)
    assert cut.truncated and cut.text.endswith("半句")
    assert not whole.truncated
    assert llm_client.successes == 2


async def test_successes_count_answers_only(llm: ScriptedLlm) -> None:
    """The per-event failure budget reads this: a rejection or an unusable 2xx is no sign that the
    provider answers other events."""
    llm.script("ok", '{"memories": []}')
    llm.script("rejected", status=400)
    llm.script("unusable", raw_body=b"{}")
    llm.script("down", status=503)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF)
    for marker in ("ok", "rejected", "unusable", "down", "ok"):
        with contextlib.suppress(LlmError):
            await llm_client.complete("extraction", OPENAI, messages(marker), SHAPE, caller=marker)
    assert llm_client.successes == 2


async def test_a_json_schema_refused_with_500_falls_back_once_per_model_not_per_event(
    llm: ScriptedLlm,
) -> None:
    """llama.cpp's server answers every JSON-schema request with 500: after the retries, JSON mode
    is tried, answered, and kept."""
    metrics = Metrics()
    llm.script("marker-b", status=500, only_if=schema_requests)
    llm.script("marker-b", {"memories": []})
    llm_client = client(llm, metrics)

    for _ in range(3):
        await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-b"), SHAPE)

    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-b")]
    assert sent == ["json_schema"] * 3 + ["json_object"] * 3
    assert llm_client.mode("openai/gpt-4o-mini") is StructuredOutput.JSON_OBJECT
    fallbacks = metrics.registry.get_sample_value(
        "mao_memory_llm_structured_output_fallbacks_total",
        {"from_mode": "json_schema", "to_mode": "json_object"},
    )
    assert fallbacks == 1


async def test_one_5xx_on_a_models_first_json_schema_call_keeps_json_schema(llm: ScriptedLlm) -> None:
    metrics = Metrics()
    llm.script("marker-h", status=502, times=1)
    llm.script("marker-h", {"memories": []})
    llm_client = client(llm, metrics)

    await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-h"), SHAPE)
    await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-h"), SHAPE)

    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-h")]
    assert sent == ["json_schema"] * 3
    assert llm_client.mode("openai/gpt-4o-mini") is StructuredOutput.JSON_SCHEMA
    assert metrics.llm_mode_fallbacks.labels("json_schema", "json_object")._value.get() == 0


async def test_an_outage_on_the_first_calls_changes_no_mode(llm: ScriptedLlm) -> None:
    """Every mode fails alike: the weaker one was never answered, so nothing is learnt."""
    llm.script("marker-c", status=503)
    llm_client = client(llm, Metrics())
    with pytest.raises(LlmError) as failed:
        await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-c"), SHAPE)
    assert failed.value.failure is FailureClass.OUTAGE and failed.value.status == 503
    assert llm_client.mode("openai/gpt-4o-mini") is StructuredOutput.JSON_SCHEMA
    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-c")]
    assert sent == ["json_schema"] * 3 + ["json_object"] * 3 + [None] * 3  # each mode's own retries


async def test_a_mode_left_after_5xx_answers_is_tried_again_and_kept_once_answered(llm: ScriptedLlm) -> None:
    """llama.cpp's server answers 503 "Loading model" while it loads: the first call walks down to
    no structured output, and json_schema comes back after the retry count."""
    llm.script("marker-l", status=503, times=7)
    llm.script("marker-l", {"memories": []})
    llm_client = client(llm, Metrics())
    llm_client._mode_retry_calls = 2
    for _ in range(4):
        await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-l"), SHAPE)
    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-l")]
    assert sent == ["json_schema"] * 3 + ["json_object"] * 3 + [None] * 4 + ["json_schema"]
    assert llm_client.mode("openai/gpt-4o-mini") is StructuredOutput.JSON_SCHEMA


async def test_a_late_answer_in_a_weaker_mode_never_replaces_a_confirmed_one(llm: ScriptedLlm) -> None:
    """Two first calls: A's json_schema meets a short outage and A moves to json_object; B's
    json_schema is answered meanwhile; A's json_object answer arrives after."""
    llm.script("marker-a", status=503, only_if=schema_requests)
    llm.script("marker-a", {"memories": []}, delay_s=1.0)
    llm.script("marker-b", {"memories": []}, delay_s=0.3)
    llm_client = client(llm, Metrics(), max_retries=1)
    model = "openai/gpt-4o-mini"
    await asyncio.gather(
        llm_client.complete("extraction", model, messages("marker-a"), SHAPE, caller="a"),
        llm_client.complete("extraction", model, messages("marker-b"), SHAPE, caller="b"),
    )
    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-a")]
    assert sent[-1] == "json_object"
    assert llm_client.mode(model) is StructuredOutput.JSON_SCHEMA


async def test_a_4xx_to_a_json_schema_moves_to_json_mode_at_once(llm: ScriptedLlm) -> None:
    llm.script("marker-i", status=400, only_if=schema_requests)
    llm.script("marker-i", {"memories": []})
    llm_client = client(llm, Metrics())
    await llm_client.complete("extraction", "openai/gpt-4o-mini", messages("marker-i"), SHAPE)
    sent = [(c.body.get("response_format") or {}).get("type") for c in llm.calls("marker-i")]
    assert sent == ["json_schema", "json_object"]
    assert llm_client.mode("openai/gpt-4o-mini") is StructuredOutput.JSON_OBJECT


async def test_a_rejection_carries_the_providers_status_and_is_not_retried(llm: ScriptedLlm) -> None:
    llm.script("marker-d", status=400)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF)
    with pytest.raises(LlmError) as rejected:
        await llm_client.complete("extraction", OPENAI, messages("marker-d"), SHAPE)
    assert (rejected.value.kind, rejected.value.retryable, rejected.value.status) == ("rejected", False, 400)
    assert "HTTP 400" in rejected.value.detail and len(llm.calls("marker-d")) == 1


@pytest.mark.parametrize("status", [401, 404])
async def test_a_status_rejecting_every_caller_is_an_outage_behind_the_breaker(
    llm: ScriptedLlm, status: int
) -> None:
    """A revoked key (401), a retired model or one Ollama is still pulling (404): after as many
    different callers as open the breaker, the rejection is the provider's, not the events'."""
    breaker = CircuitBreaker(threshold=3, open_s=5, max_open_s=10)
    llm.script("revoked", status=status)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker)
    classes = []
    for n in range(6):
        with pytest.raises(LlmError) as failed:
            await llm_client.complete("extraction", OPENAI, messages("revoked"), SHAPE, caller=n, wait=False)
        classes.append(failed.value.failure)
    assert classes == [FailureClass.REJECTED] * 2 + [FailureClass.OUTAGE] * 4
    assert breaker.state is BreakerState.OPEN
    assert len(llm.calls("revoked")) == 5  # the last caller met the open breaker


async def test_a_4xx_for_one_event_while_others_are_answered_stays_a_rejection(llm: ScriptedLlm) -> None:
    breaker = CircuitBreaker(threshold=3, open_s=5, max_open_s=10)
    llm.script("too-long", status=404)
    llm.script("fine", {"memories": []})
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker)
    for n in range(6):
        with pytest.raises(LlmError) as failed:
            await llm_client.complete("extraction", OPENAI, messages("too-long"), SHAPE, caller=n)
        assert failed.value.failure is FailureClass.REJECTED
        await llm_client.complete("extraction", OPENAI, messages("fine"), SHAPE, caller=f"ok{n}")
    assert breaker.state is BreakerState.CLOSED


@pytest.mark.parametrize(
    "rule",
    [{"status": 503}, {"delay_s": 0.6}, {"raw_body": b'{"id": "c"}'}, {"status": 409}],
    ids=["503", "timeout", "no choices", "409"],
)
async def test_one_event_failing_again_and_again_never_opens_the_breaker(
    llm: ScriptedLlm, rule: dict[str, Any]
) -> None:
    """The issue's measurement: one event the model always failed on opened the shared breaker, and
    a healthy event arriving then waited seconds. Its failures are one caller's."""
    breaker = CircuitBreaker(threshold=3, open_s=5, max_open_s=10)
    llm.script("poison", **rule)
    llm.script("healthy", {"memories": []})
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker, timeout_s=0.3)
    for _ in range(6):
        with pytest.raises(LlmError):
            await llm_client.complete("extraction", OPENAI, messages("poison"), SHAPE, caller="event-poison")
    assert breaker.state is BreakerState.CLOSED

    loop = asyncio.get_running_loop()
    started = loop.time()
    await llm_client.complete("extraction", OPENAI, messages("healthy"), SHAPE, caller="event-healthy")
    assert loop.time() - started < 0.5


async def test_different_callers_failing_with_no_success_between_open_the_breaker(llm: ScriptedLlm) -> None:
    breaker = CircuitBreaker(threshold=3, open_s=5, max_open_s=10)
    llm.script("down", status=503)
    llm.script("up", {"memories": []})
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker)

    async def call(marker: str, caller: str) -> None:
        with contextlib.suppress(LlmError):
            await llm_client.complete(
                "extraction", OPENAI, messages(marker), SHAPE, wait=False, caller=caller
            )

    for caller in ("a", "b", "a", "b"):
        await call("down", caller)
    await call("up", "c")  # a success: the count starts again
    for caller in ("d", "e"):
        await call("down", caller)
    assert breaker.state is BreakerState.CLOSED
    await call("down", "f")
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(LlmError) as unavailable:
        await llm_client.complete("extraction", OPENAI, messages("up"), SHAPE, wait=False, caller="g")
    assert (unavailable.value.kind, unavailable.value.failure) == ("unavailable", FailureClass.OUTAGE)


async def test_the_breaker_opens_on_an_outage_and_one_probe_closes_it(llm: ScriptedLlm) -> None:
    metrics = Metrics()
    states: list[BreakerState] = []
    breaker = CircuitBreaker(threshold=3, open_s=0.5, max_open_s=2, on_change=states.append)
    llm_client = client(llm, metrics, StructuredOutput.OFF, breaker=breaker)
    llm.script("marker-e", status=503, times=9)  # three failed calls of three tries each
    llm.script("marker-e", [])
    for event in range(3):
        with pytest.raises(LlmError):
            await llm_client.complete("extraction", OPENAI, messages("marker-e"), SHAPE, caller=event)
    assert breaker.state is BreakerState.OPEN and len(llm.calls("marker-e")) == 9

    with pytest.raises(LlmError, match="unavailable"):  # consolidation does not wait
        await llm_client.complete("consolidation", OPENAI, messages("marker-e"), SHAPE, wait=False)
    waiting = [
        asyncio.create_task(
            llm_client.complete("extraction", OPENAI, messages("marker-e"), SHAPE, caller=event)
        )
        for event in range(3, 8)
    ]
    await asyncio.sleep(0.2)
    assert len(llm.calls("marker-e")) == 9  # nothing goes out while open
    await asyncio.gather(*waiting)

    assert len(llm.calls("marker-e")) == 9 + 5  # one probe, then the rest once it closed
    assert states == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


async def test_a_late_failure_of_a_call_admitted_before_the_breaker_opened_is_not_the_probes(
    llm: ScriptedLlm,
) -> None:
    """A slow call admitted while closed fails after the breaker opened and while the probe is out:
    it must neither re-open the breaker nor double its wait; the probe's success closes it."""
    states: list[BreakerState] = []
    breaker = CircuitBreaker(threshold=2, open_s=0.3, max_open_s=10, on_change=states.append)
    llm.script("late", status=503, delay_s=0.7)
    llm.script("down", status=503)
    llm.script("probe", {"memories": []}, delay_s=0.6)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker, max_retries=0)

    late = asyncio.create_task(llm_client.complete("extraction", OPENAI, messages("late"), SHAPE))
    await asyncio.sleep(0.05)
    for _ in range(2):
        with pytest.raises(LlmError):
            await llm_client.complete("extraction", OPENAI, messages("down"), SHAPE)
    assert breaker.state is BreakerState.OPEN
    await llm_client.complete("extraction", OPENAI, messages("probe"), SHAPE)  # waits, probes
    with pytest.raises(LlmError):
        await late

    assert states == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


async def test_a_failed_probe_opens_the_breaker_for_twice_as_long(llm: ScriptedLlm) -> None:
    breaker = CircuitBreaker(threshold=1, open_s=0.2, max_open_s=0.3)
    llm_client = client(llm, Metrics(), StructuredOutput.OFF, breaker=breaker)
    llm.script("marker-f", status=503)
    loop = asyncio.get_running_loop()
    with pytest.raises(LlmError):
        await llm_client.complete("extraction", OPENAI, messages("marker-f"), SHAPE)
    started = loop.time()
    with pytest.raises(LlmError):  # waits 0.2 s, probes, fails
        await llm_client.complete("extraction", OPENAI, messages("marker-f"), SHAPE)
    assert loop.time() - started >= 0.2
    started = loop.time()
    with pytest.raises(LlmError):  # now 0.3 s (capped)
        await llm_client.complete("extraction", OPENAI, messages("marker-f"), SHAPE)
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
