"""The model call through litellm: one timeout, our own bounded retries, structured output, metrics.

litellm's built-in retries multiply the timeout, so they are off (`num_retries=0`) and retries
happen here: only on 429, 5xx and refused connections, with back-off that honours Retry-After.
A failure is classed for the caller: retryable (an outage: the event waits and is tried again) or
rejected (a 4xx other than 429: a setting to fix, the event goes to the dead-letter topic).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.adapters.circuit_breaker import CircuitBreaker
from service.adapters.metrics import Metrics

MAX_RETRY_AFTER_S = 30.0


class StructuredOutput(StrEnum):
    """`MEMORY_LLM_STRUCTURED_OUTPUT`; `auto` picks json_schema where litellm says the model takes one."""

    AUTO = "auto"
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    OFF = "off"


# The weaker mode to try when a provider refuses one.
_WEAKER = {
    StructuredOutput.JSON_SCHEMA: StructuredOutput.JSON_OBJECT,
    StructuredOutput.JSON_OBJECT: StructuredOutput.OFF,
}


class LlmError(Exception):
    """The call produced no answer. `kind` is the metric label: timeout, error, rejected, unavailable."""

    def __init__(self, kind: str, detail: str, retryable: bool, status: int | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.retryable = retryable
        self.status = status


@dataclass(frozen=True, slots=True)
class LlmAnswer:
    text: str
    model: str


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """What the caller asks for: the wrapper object's name and its JSON schema, and a token cap."""

    name: str
    schema: dict[str, Any]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class _Call:
    purpose: str
    model: str
    messages: list[dict[str, str]]
    shape: AnswerShape


def import_litellm() -> Any:
    """Import once, configured for a closed network (no cost-map download, no debug banners)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


class LlmClient:
    def __init__(
        self,
        metrics: Metrics,
        api_base: str | None,
        api_key: str | None,
        timeout_s: float,
        max_retries: int,
        retry_base_s: float,
        breaker: CircuitBreaker | None = None,
        structured_output: StructuredOutput = StructuredOutput.AUTO,
    ) -> None:
        self._litellm = import_litellm()
        self._metrics = metrics
        self._api_base = api_base
        # A local OpenAI-compatible server needs no key, but the OpenAI client refuses to send none.
        self._api_key = api_key or ("none" if api_base else None)
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._retry_base_s = retry_base_s
        self._breaker = breaker or CircuitBreaker(threshold=5, open_s=5, max_open_s=60)
        self._configured = structured_output
        self._modes: dict[str, StructuredOutput] = {}  # per model, for the process's life
        self._confirmed: set[tuple[str, StructuredOutput]] = set()

    def mode(self, model: str) -> StructuredOutput:
        """The structured-output mode this model gets now; the prompt asks for the wrapper unless off."""
        if model not in self._modes:
            chosen = self._configured
            if chosen is StructuredOutput.AUTO:
                schema = self._litellm.supports_response_schema(model=model)
                chosen = StructuredOutput.JSON_SCHEMA if schema else StructuredOutput.JSON_OBJECT
            self._modes[model] = chosen
        return self._modes[model]

    async def complete(
        self, purpose: str, model: str, messages: list[dict[str, str]], shape: AnswerShape, wait: bool = True
    ) -> LlmAnswer:
        """One answer, or LlmError. While the breaker is open, waits (or, with `wait=False`, fails)."""
        if not await self._breaker.admit(wait):
            self._metrics.llm_calls.labels(purpose, "unavailable").inc()
            raise LlmError("unavailable", "the model's circuit breaker is open", retryable=True)
        try:
            answer = await self._with_fallback(_Call(purpose, model, messages, shape))
        except LlmError as exc:
            if exc.retryable:
                self._breaker.failed()
            else:
                self._breaker.succeeded()  # the provider answered; the request was wrong
            raise
        except BaseException:
            self._breaker.abandoned()
            raise
        self._breaker.succeeded()
        return answer

    async def _with_fallback(self, call: _Call) -> LlmAnswer:
        """A provider that refuses a structured-output mode is found out on the model's first calls:
        a 4xx (or, for a JSON schema, a 5xx) to a mode not yet answered moves to the weaker mode at
        once, without the retries, and the weaker mode is kept for the model if it is answered."""
        model = call.model
        mode = self.mode(model)
        while True:
            confirmed = (model, mode) in self._confirmed
            try:
                answer = await self._with_retries(call, mode, confirmed)
                break
            except LlmError as exc:
                weaker = _WEAKER.get(mode)
                if confirmed or weaker is None or not _refuses_mode(mode, exc):
                    raise
                self._metrics.llm_mode_fallbacks.labels(mode.value, weaker.value).inc()
                mode = weaker
        self._confirmed.add((model, mode))
        self._modes[model] = mode
        return answer

    async def _with_retries(self, call: _Call, mode: StructuredOutput, confirmed: bool) -> LlmAnswer:
        attempt = 0
        while True:
            try:
                return await self._once(call, mode)
            except LlmError:
                raise
            except Exception as exc:
                error = _classify(exc)
                delay = self._retry_delay(exc, error, attempt)
                if not confirmed and _refuses_mode(mode, error):
                    delay = None  # find out about the mode now, not after the retries
                if delay is None or attempt >= self._max_retries:
                    self._metrics.llm_calls.labels(call.purpose, error.kind).inc()
                    raise error from exc
                self._metrics.llm_retries.labels(call.purpose).inc()
                attempt += 1
                await asyncio.sleep(delay)

    async def _once(self, call: _Call, mode: StructuredOutput) -> LlmAnswer:
        purpose, model, messages, shape = call.purpose, call.model, call.messages, call.shape
        started = time.perf_counter()
        self._metrics.llm_prompt_chars.labels(purpose).observe(sum(len(m["content"]) for m in messages))
        extra = {"response_format": response_format(mode, shape)} if mode is not StructuredOutput.OFF else {}
        try:
            response = await self._litellm.acompletion(
                model=model,
                messages=messages,
                api_base=self._api_base,
                api_key=self._api_key,
                timeout=self._timeout_s,
                num_retries=0,
                temperature=0,
                max_tokens=shape.max_tokens,
                **extra,
            )
        finally:
            self._metrics.llm_latency.labels(purpose).observe(time.perf_counter() - started)
        self._account(purpose, model, response)
        try:
            text = response.choices[0].message.content
        except (AttributeError, IndexError, TypeError) as exc:
            self._metrics.llm_calls.labels(purpose, "error").inc()
            raise LlmError("error", "answer without a message", retryable=True) from exc
        return LlmAnswer(text=text or "", model=model)

    def _account(self, purpose: str, model: str, response: Any) -> None:
        usage = getattr(response, "usage", None)
        if usage is None:
            return
        self._metrics.llm_tokens.labels(purpose, "prompt").inc(getattr(usage, "prompt_tokens", 0) or 0)
        self._metrics.llm_tokens.labels(purpose, "completion").inc(
            getattr(usage, "completion_tokens", 0) or 0
        )
        try:
            cost = float(self._litellm.completion_cost(completion_response=response, model=model))
        except Exception:
            return  # a model outside litellm's cost map has no price; tokens are still counted
        self._metrics.llm_cost.labels(purpose).inc(max(cost, 0.0))

    def _retry_delay(self, exc: Exception, error: LlmError, attempt: int) -> float | None:
        """None when retrying at once cannot help (a timeout, a 4xx other than 429, a bad request)."""
        if not error.retryable or error.kind == "timeout":
            return None
        retry_after = _retry_after(exc)
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        return float(self._retry_base_s * (2**attempt) * (0.5 + random.random()))


def response_format(mode: StructuredOutput, shape: AnswerShape) -> dict[str, Any]:
    if mode is StructuredOutput.JSON_SCHEMA:
        return {
            "type": "json_schema",
            "json_schema": {"name": shape.name, "strict": True, "schema": shape.schema},
        }
    return {"type": "json_object"}


def _classify(exc: BaseException) -> LlmError:
    """Timeouts, 429, 5xx and connection errors are an outage; any other 4xx is the request's fault."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    detail = (f"HTTP {status} " if status else "") + f"{name}: {exc}"[:1000]
    if "Timeout" in name or isinstance(exc, TimeoutError):
        return LlmError("timeout", detail, retryable=True)
    if status is not None and 400 <= status < 500 and status != 429:
        return LlmError("rejected", detail, retryable=False, status=status)
    return LlmError("error", detail, retryable=True, status=status)


def _refuses_mode(mode: StructuredOutput, error: LlmError) -> bool:
    """A 4xx may be the mode's fault; llama.cpp's server answers a JSON schema it cannot take with 500."""
    if mode is StructuredOutput.OFF or error.status is None:
        return False
    return error.kind == "rejected" or (mode is StructuredOutput.JSON_SCHEMA and error.status >= 500)


def _retry_after(exc: Exception) -> float | None:
    headers: Any = getattr(getattr(exc, "response", None), "headers", None) or getattr(
        exc, "litellm_response_headers", None
    )
    if not headers:
        return None
    value = headers.get("retry-after") or headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
