"""The model call through litellm: one timeout, our own bounded retries, structured output, metrics.

OpenAI's chat format (OpenAI and every OpenAI-compatible server) goes out on one shared aiohttp
session with requests litellm builds (`litellm_requests`); other providers go through
`litellm.acompletion`, which translates their wire formats. Either way litellm resolves the model.

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

import aiohttp
import orjson

from service.adapters.circuit_breaker import CircuitBreaker
from service.adapters.litellm_requests import ChatEndpoint, chat_endpoint
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


class ProviderHttpError(Exception):
    """A non-2xx answer on the shared session, shaped like litellm's errors for `_classify`."""

    def __init__(self, status: int, body: str, headers: Any) -> None:
        super().__init__(body)
        self.status_code = status
        self.headers = headers


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


# The answer's text (None: no message in it) and its (prompt, completion) token counts, if reported.
_Result = tuple[str | None, tuple[int, int] | None]


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
        max_connections: int = 64,
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
        # Resolved once per model / per (model, mode, token cap) / per model: litellm's work is not
        # repeated on every call.
        self._endpoints: dict[str, ChatEndpoint | None] = {}
        self._params: dict[tuple[str, StructuredOutput, int], dict[str, Any]] = {}
        self._prices: dict[str, tuple[float, float] | None] = {}
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def stop(self) -> None:
        """Close the shared HTTP session (at shutdown)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        purpose, model, messages = call.purpose, call.model, call.messages
        started = time.perf_counter()
        self._metrics.llm_prompt_chars.labels(purpose).observe(sum(len(m["content"]) for m in messages))
        endpoint = self._endpoint(model)
        try:
            if endpoint is None:
                text, usage = await self._through_litellm(call, mode)
            else:
                text, usage = await self._post(endpoint, call, mode)
        finally:
            self._metrics.llm_latency.labels(purpose).observe(time.perf_counter() - started)
        if usage is not None:
            self._account(purpose, model, *usage)
        if text is None:
            self._metrics.llm_calls.labels(purpose, "error").inc()
            raise LlmError("error", "answer without a message", retryable=True)
        return LlmAnswer(text=text, model=model)

    def _endpoint(self, model: str) -> ChatEndpoint | None:
        if model not in self._endpoints:
            self._endpoints[model] = chat_endpoint(self._litellm, model, self._api_base, self._api_key)
        return self._endpoints[model]

    async def _post(self, endpoint: ChatEndpoint, call: _Call, mode: StructuredOutput) -> _Result:
        key = (call.model, mode, call.shape.max_tokens)
        params = self._params.get(key)
        if params is None:
            fmt = response_format(mode, call.shape)
            params = self._params[key] = endpoint.params(self._litellm, call.shape.max_tokens, fmt)
        body = endpoint.body(call.messages, params)
        async with self._http().post(endpoint.url, data=body, headers=endpoint.headers) as response:
            raw = await response.read()
            if response.status >= 300:
                raise ProviderHttpError(
                    response.status, raw[:1000].decode("utf-8", "replace"), response.headers
                )
        try:
            data = orjson.loads(raw)
            usage = data.get("usage") or {}
            counts = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
            text = data["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
            return None, None
        if text is None:
            return "", counts  # a message without content: an empty answer, as litellm gives it
        return (text if isinstance(text, str) else None), counts

    def _http(self) -> aiohttp.ClientSession:
        """One session per process: keep-alive connections, at most `max_connections` of them."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            )
        return self._session

    async def _through_litellm(self, call: _Call, mode: StructuredOutput) -> _Result:
        fmt = response_format(mode, call.shape)
        extra = {"response_format": fmt} if fmt is not None else {}
        response = await self._litellm.acompletion(
            model=call.model,
            messages=call.messages,
            api_base=self._api_base,
            api_key=self._api_key,
            timeout=self._timeout_s,
            num_retries=0,
            temperature=0,
            max_tokens=call.shape.max_tokens,
            **extra,
        )
        usage = getattr(response, "usage", None)
        counts = (
            (getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)
            if usage is not None
            else None
        )
        try:
            return response.choices[0].message.content or "", counts
        except (AttributeError, IndexError, TypeError):
            return None, counts

    def _account(self, purpose: str, model: str, prompt: int, completion: int) -> None:
        self._metrics.llm_tokens.labels(purpose, "prompt").inc(prompt)
        self._metrics.llm_tokens.labels(purpose, "completion").inc(completion)
        price = self._price(model)
        if price is not None:
            self._metrics.llm_cost.labels(purpose).inc(max(prompt * price[0] + completion * price[1], 0.0))

    def _price(self, model: str) -> tuple[float, float] | None:
        """USD per prompt and per completion token from litellm's local cost map, looked up once per
        model; a model outside the map has no price, and its tokens are still counted."""
        if model not in self._prices:
            try:
                per_million = self._litellm.cost_per_token(
                    model=model, prompt_tokens=1_000_000, completion_tokens=1_000_000
                )
                self._prices[model] = (per_million[0] / 1e6, per_million[1] / 1e6)
            except Exception:
                self._prices[model] = None
        return self._prices[model]

    def _retry_delay(self, exc: Exception, error: LlmError, attempt: int) -> float | None:
        """None when retrying at once cannot help (a timeout, a 4xx other than 429, a bad request)."""
        if not error.retryable or error.kind == "timeout":
            return None
        retry_after = _retry_after(exc)
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        return float(self._retry_base_s * (2**attempt) * (0.5 + random.random()))


def response_format(mode: StructuredOutput, shape: AnswerShape) -> dict[str, Any] | None:
    """The request's `response_format`; None when structured output is off."""
    if mode is StructuredOutput.OFF:
        return None
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
    headers: Any = (
        getattr(exc, "headers", None)
        or getattr(getattr(exc, "response", None), "headers", None)
        or getattr(exc, "litellm_response_headers", None)
    )
    if not headers:
        return None
    value = headers.get("retry-after") or headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
