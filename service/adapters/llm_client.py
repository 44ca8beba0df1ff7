"""The model call through litellm: one timeout, our own bounded retries, structured output, metrics.

OpenAI's chat format (OpenAI and every OpenAI-compatible server) goes out on one shared aiohttp
session with requests litellm builds (`litellm_requests`); other providers, and configurations that
path does not reproduce, go through `litellm.acompletion`. Either way litellm resolves the model and
maps its parameters.

litellm's built-in retries multiply the timeout, so they are off (`num_retries=0`) and retries
happen here, only for failures that look like an outage. Every failure is classed for the caller
(`llm_failures`): OUTAGE, EVENT or REJECTED; the circuit breaker counts failures by caller.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import aiohttp

from service.adapters.circuit_breaker import CircuitBreaker
from service.adapters.litellm_requests import (
    MARKED_CACHE_PROVIDERS,
    BodyTemplate,
    ChatEndpoint,
    Reply,
    cache_marked,
    chat_endpoint,
    model_params,
    read_completion,
    read_model_response,
)
from service.adapters.llm_failures import FailureClass, LlmError, ProviderHttpError, classify, unusable
from service.adapters.metrics import Metrics
from service.adapters.structured_output import (
    WEAKER,
    AnswerShape,
    StructuredOutput,
    refuses_mode,
    response_format,
)
from service.core.backoff import Backoff
from service.core.labels import LlmPurpose, LlmResult

__all__ = [
    "AnswerShape",
    "FailureClass",
    "LlmAnswer",
    "LlmClient",
    "LlmError",
    "StructuredOutput",
    "response_format",
]

# A mode left after 5xx answers (an outage may look like a refusal) is tried again after this long
# or this many calls of the model, whichever comes first.
MODE_RETRY_S = 600.0
MODE_RETRY_CALLS = 100

# A probe's answer: a word is enough to show the model answers (`probe`).
PROBE_SHAPE = AnswerShape("probe", {}, max_tokens=8)

# Room for a reasoning model's hidden reasoning on top of the answer cap (`MEMORY_LLM_REASONING_TOKENS`).
DEFAULT_REASONING_TOKENS = 4096

# An answer's body, decompressed, is read up to 64 KiB plus 32 bytes per token it may hold (a token
# is at most ~4 characters, each at most 6 bytes escaped in JSON, with room for the envelope and a
# reasoning model's reasoning text): 224 KiB for an extraction. Anything longer is no answer of
# ours, compressed or not (a gateway's gzip bomb), and is never held whole.
ANSWER_BASE_BYTES = 64 * 1024
ANSWER_BYTES_PER_TOKEN = 32
# Of an error answer only this much is read: its start names the error.
ERROR_BODY_BYTES = 4096


@dataclass(frozen=True, slots=True)
class LlmAnswer:
    """`truncated`: the answer hit the token cap (`finish_reason` "length"), so it is cut short."""

    text: str
    model: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class _Call:
    purpose: str
    model: str
    messages: list[dict[str, str]]
    shape: AnswerShape


def _strength(mode: StructuredOutput) -> int:
    """How much a mode asks of the provider: json_schema 2, json_object 1, off 0."""
    strength = 0
    while mode in WEAKER:
        mode, strength = WEAKER[mode], strength + 1
    return strength


def import_litellm() -> Any:
    """Import once, configured for a closed network (no cost-map download, no debug banners). In its
    default DEV mode litellm loads the first `.env` found upward from its install directory, which
    with the venv inside a checkout is the repository's: PRODUCTION mode keeps that file out."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
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
        reasoning_effort: str | None = None,
        reasoning_tokens: int = DEFAULT_REASONING_TOKENS,
        defer_import: bool = False,
    ) -> None:
        # litellm takes seconds to import: `defer_import` leaves it to `load` (or the first call).
        self._library: Any = None if defer_import else import_litellm()
        self._metrics = metrics
        self._api_base = api_base
        # A local OpenAI-compatible server needs no key, but the OpenAI client refuses to send none.
        self._api_key = api_key or ("none" if api_base else None)
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        # Between an outage's tries: retry_base_s, doubling, each times a factor in [0.5, 1.5).
        self._retry_backoff = Backoff(retry_base_s, jitter=1.0)
        self._breaker = breaker or CircuitBreaker(threshold=5, open_s=5, max_open_s=60)
        self._configured = structured_output
        self._effort = reasoning_effort
        self._reasoning_tokens = reasoning_tokens
        self._modes: dict[str, StructuredOutput] = {}  # per model, for the process's life
        self._confirmed: set[tuple[str, StructuredOutput]] = set()
        self._answered: Counter[tuple[str, StructuredOutput]] = Counter()
        # Per model: the stronger mode left after 5xx answers, when to try it again, calls since.
        self._retry_mode: dict[str, tuple[StructuredOutput, float, int]] = {}
        self._mode_retry_s = MODE_RETRY_S
        self._mode_retry_calls = MODE_RETRY_CALLS
        # Resolved once per model / per (model, token cap) / per (model, mode, token cap) / per
        # model / per (model, mode, token cap, roles): litellm's work is not repeated on every call.
        self._endpoints: dict[str, ChatEndpoint | None] = {}
        # Per model: whether its provider caches only the prompt prefix a request marks.
        self._marks_cache: dict[str, bool] = {}
        self._model_params: dict[tuple[str, int], dict[str, Any]] = {}
        self._params: dict[tuple[str, StructuredOutput, int], dict[str, Any]] = {}
        self._prices: dict[str, tuple[float, float, float, float] | None] = {}
        self._templates: dict[
            tuple[tuple[str, StructuredOutput, int], tuple[str, ...]], BodyTemplate | None
        ] = {}
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._successes = 0
        self._attempts = 0  # requests sent, numbered in the order they went out
        self._latest_answered = -1  # the number of the latest-sent request that was answered
        self._answered_at: float | None = None  # monotonic time of the last answer
        # Per status: the callers rejected with it since the last answer (a revoked key, a retired
        # model, a model still being pulled reject every caller alike).
        self._rejecting: dict[int | None, set[Hashable]] = {}

    def load(self) -> Any:
        """litellm, imported now if construction deferred it: the process loads it as it starts
        consuming, once its HTTP server answers, rather than in the first call."""
        if self._library is None:
            self._library = import_litellm()
        return self._library

    @property
    def _litellm(self) -> Any:
        return self.load()

    @property
    def successes(self) -> int:
        """Calls that returned an answer (truncated ones included), counted since start. A rejection
        or an unusable 2xx is not one: a provider answering every event with garbage must not make
        each event look like the only one failing."""
        return self._successes

    def answered_ago(self) -> float | None:
        """Seconds since the model last answered a call; None before the first answer."""
        return None if self._answered_at is None else time.monotonic() - self._answered_at

    async def stop(self) -> None:
        """Close the shared HTTP session (at shutdown)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def mode(self, model: str) -> StructuredOutput:
        """The structured-output mode this model gets now; the prompt asks for the wrapper unless off.
        A mode left after 5xx answers comes back once its retry time or call count is reached."""
        retry = self._retry_mode.get(model)
        if retry is not None:
            stronger, since, calls = retry
            if calls >= self._mode_retry_calls or time.monotonic() - since >= self._mode_retry_s:
                del self._retry_mode[model]
                self._modes[model] = stronger
        if model not in self._modes:
            chosen = self._configured
            if chosen is StructuredOutput.AUTO:
                schema = self._litellm.supports_response_schema(model=model)
                chosen = StructuredOutput.JSON_SCHEMA if schema else StructuredOutput.JSON_OBJECT
            self._modes[model] = chosen
        return self._modes[model]

    def provider_problem(self, model: str) -> str | None:
        """Why litellm cannot route `model` (no provider it knows, as it resolves the name for a call
        with this API base), or None. `openai/<anything>` passes: only a call tells a model the
        server does not serve."""
        try:
            self._litellm.get_llm_provider(model=model, api_base=self._api_base)
        except Exception as exc:
            # litellm's message is several lines with an ANSI-coloured link; its first line says it.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"litellm maps {model!r} to no provider ({first.removeprefix('litellm.')})"
        return None

    async def probe(self, model: str, timeout_s: float) -> None:
        """One tiny call to `model` before it is set, raising LlmError if it does not answer. It
        stays outside the breaker, the retries and the structured-output modes: it is about a model
        no event uses yet, and one try within `timeout_s` is the answer."""
        call = _Call(LlmPurpose.PROBE, model, [{"role": "user", "content": "Reply: OK"}], PROBE_SHAPE)
        try:
            async with asyncio.timeout(timeout_s):
                await self._once(call, StructuredOutput.OFF)
        except Exception as exc:
            error = exc if isinstance(exc, LlmError) else classify(exc)
            self._metrics.llm_calls.labels(call.purpose, error.kind).inc()
            if error is exc:
                raise
            raise error from exc
        self._metrics.llm_calls.labels(call.purpose, LlmResult.OK).inc()

    async def complete(
        self,
        purpose: str,
        model: str,
        messages: list[dict[str, str]],
        shape: AnswerShape,
        wait: bool = True,
        *,
        caller: Hashable | None = None,
        mode: StructuredOutput | None = None,
    ) -> LlmAnswer:
        """One answer, or LlmError. While the breaker is open, waits (or, with `wait=False`, fails).
        `caller` names who asks (an event id, a consolidation run): the breaker opens only when
        different callers fail. `mode`: the one `mode()` gave when the prompt was built; the request
        starts no stronger, so a mode restored while the call waited cannot meet a bare-array prompt."""
        ticket = await self._breaker.admit(wait)
        if ticket is None:
            self._metrics.llm_calls.labels(purpose, "unavailable").inc()
            breaker = "the model's circuit breaker is open"
            raise LlmError("unavailable", breaker, FailureClass.OUTAGE, safe=breaker)
        try:
            answer = await self._with_fallback(_Call(purpose, model, messages, shape), mode)
        except LlmError as exc:
            error = self._systemic(exc, caller)
            if error.retryable:
                self._breaker.failed(ticket, caller)
            else:
                self._breaker.succeeded(ticket)  # the provider answered; the request was wrong
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            self._breaker.abandoned(ticket)
            raise
        self._successes += 1
        self._rejecting.clear()
        self._breaker.succeeded(ticket)
        return answer

    def _systemic(self, error: LlmError, caller: Hashable | None) -> LlmError:
        """A rejection is the request's fault unless the same status has rejected as many different
        callers as open the breaker, with no answer between: then it is the setting or the provider
        (a revoked key, a retired model), and callers wait behind the breaker as in an outage
        instead of each going to the dead-letter topic."""
        if error.failure is not FailureClass.REJECTED:
            return error
        callers = self._rejecting.setdefault(error.status, set())
        if len(callers) < self._breaker.threshold:
            callers.add(object() if caller is None else caller)
        if len(callers) < self._breaker.threshold:
            return error
        return LlmError(
            error.kind,
            f"every caller rejected: {error.detail}"[:1000],
            FailureClass.OUTAGE,
            error.status,
            safe=f"every caller rejected: {error.safe}",
        )

    async def _with_fallback(self, call: _Call, built_for: StructuredOutput | None = None) -> LlmAnswer:
        """A mode the provider refuses (a 4xx, or a 5xx that outlasts the retries) before it ever
        answered that mode moves to the weaker one, and the weaker mode is kept only if answered.

        Concurrent calls and outages must not move the mode by chance: a mode once answered is never
        left, a 5xx moves down only if no call was answered in that mode meanwhile, and a mode left
        after 5xx answers is tried again later (`mode`)."""
        model = call.model
        mode = self.mode(model)
        if built_for is not None and _strength(built_for) < _strength(mode):
            mode = built_for  # a weaker mode still parses a wrapped prompt's answer; not the reverse
        if model in self._retry_mode:
            stronger, since, calls = self._retry_mode[model]
            self._retry_mode[model] = (stronger, since, calls + 1)
        answered_before = self._answered[(model, mode)]
        tried: list[tuple[StructuredOutput, LlmError]] = []
        while True:
            try:
                answer = await self._with_retries(call, mode)
                break
            except LlmError as exc:
                weaker = WEAKER.get(mode)
                if weaker is None or (model, mode) in self._confirmed or not refuses_mode(exc):
                    raise
                if (
                    exc.failure is not FailureClass.REJECTED
                    and self._answered[(model, mode)] > answered_before
                ):
                    raise  # the mode was answered meanwhile: an outage, not a refusal
                tried.append((mode, exc))
                mode = weaker
                answered_before = self._answered[(model, mode)]
        self._answered[(model, mode)] += 1
        self._confirmed.add((model, mode))
        current = self._modes.get(model, mode)
        if _strength(mode) >= _strength(current):
            self._modes[model] = mode  # the same mode, or a stronger one answered again
        elif tried and tried[0][0] is current and (model, current) not in self._confirmed:
            for refused, _ in tried:
                self._metrics.llm_mode_fallbacks.labels(refused.value, WEAKER[refused].value).inc()
            self._modes[model] = mode
            outages = [refused for refused, exc in tried if exc.failure is not FailureClass.REJECTED]
            if outages:
                self._retry_mode[model] = (outages[0], time.monotonic(), 0)
        return answer

    async def _with_retries(self, call: _Call, mode: StructuredOutput) -> LlmAnswer:
        """An outage is tried again at most `max_retries` times, after the provider's Retry-After or
        else the next wait of `_retry_backoff`; any other failure, and the last one, is raised."""
        waits, retries = self._retry_backoff.delays(random.random), 0
        while True:
            sent = self._attempts
            self._attempts += 1
            try:
                answer = await self._once(call, mode)
            except Exception as exc:
                error = exc if isinstance(exc, LlmError) else classify(exc)
                error.overtaken = self._latest_answered > sent
                if error.failure is not FailureClass.OUTAGE or retries >= self._max_retries:
                    self._metrics.llm_calls.labels(call.purpose, error.kind).inc()
                    if error is exc:
                        raise
                    raise error from exc
            else:
                self._latest_answered = max(self._latest_answered, sent)
                self._answered_at = time.monotonic()
                return answer
            self._metrics.llm_retries.labels(call.purpose).inc()
            # A wait is taken on every retry: the n-th one's is base × 2^n, after a Retry-After too.
            delay = next(waits)
            await asyncio.sleep(delay if error.retry_after is None else error.retry_after)
            retries += 1

    async def _once(self, call: _Call, mode: StructuredOutput) -> LlmAnswer:
        purpose, model, messages = call.purpose, call.model, call.messages
        started = time.perf_counter()
        self._metrics.llm_prompt_chars.labels(purpose).observe(sum(len(m["content"]) for m in messages))
        endpoint = self._endpoint(model)
        try:
            # One deadline for the whole call: the HTTP clients time each read, and a provider
            # sending a byte now and then would otherwise hold the call (or the breaker's probe).
            async with asyncio.timeout(self._timeout_s):
                if endpoint is None:
                    reply = await self._through_litellm(call, mode)
                else:
                    reply = await self._post(endpoint, call, mode)
        finally:
            self._metrics.llm_latency.labels(purpose).observe(time.perf_counter() - started)
        if reply.usage is not None:
            self._account(purpose, model, *reply.usage, cache=reply.cache)
        if reply.text is None:
            raise unusable(reply.problem)
        return LlmAnswer(text=reply.text, model=model, truncated=reply.truncated)

    def _endpoint(self, model: str) -> ChatEndpoint | None:
        if model not in self._endpoints:
            self._endpoints[model] = chat_endpoint(self._litellm, model, self._api_base, self._api_key)
        return self._endpoints[model]

    def _call_params(self, call: _Call, mode: StructuredOutput) -> dict[str, Any]:
        """The parameters both paths hand litellm: the model's (`model_params`) and the format."""
        key = (call.model, call.shape.max_tokens)
        if key not in self._model_params:
            self._model_params[key] = model_params(
                self._litellm, call.model, call.shape.max_tokens, self._effort, self._reasoning_tokens
            )
        fmt = response_format(mode, call.shape)
        return self._model_params[key] | ({"response_format": fmt} if fmt is not None else {})

    async def _post(self, endpoint: ChatEndpoint, call: _Call, mode: StructuredOutput) -> Reply:
        key = (call.model, mode, call.shape.max_tokens)
        params = self._params.get(key)
        if params is None:
            params = self._params[key] = endpoint.params(self._litellm, self._call_params(call, mode))
        shape = (key, tuple(m["role"] for m in call.messages))
        if shape not in self._templates:
            self._templates[shape] = endpoint.template(shape[1], params)
        template = self._templates[shape]
        body = endpoint.body(call.messages, params) if template is None else template.body(call.messages)
        async with self._http().post(endpoint.url, data=body, headers=endpoint.headers) as response:
            if not 200 <= response.status < 300:
                start, _whole = await _read_at_most(response.content, ERROR_BODY_BYTES)
                raise ProviderHttpError(
                    response.status, start[:1000].decode("utf-8", "replace"), response.headers
                )
            limit = ANSWER_BASE_BYTES + ANSWER_BYTES_PER_TOKEN * (
                call.shape.max_tokens + self._reasoning_tokens
            )
            raw, whole = await _read_at_most(response.content, limit)
            if not whole:
                raise LlmError("oversize", f"the answer's body is over {limit} bytes", FailureClass.EVENT)
        return read_completion(raw)

    def _http(self) -> aiohttp.ClientSession:
        """One session per process: keep-alive connections, at most `max_connections` of them."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            )
        return self._session

    async def _through_litellm(self, call: _Call, mode: StructuredOutput) -> Reply:
        if call.model not in self._marks_cache:
            _, provider, _, _ = self._litellm.get_llm_provider(model=call.model)
            self._marks_cache[call.model] = provider in MARKED_CACHE_PROVIDERS
        marked = self._marks_cache[call.model]
        response = await self._litellm.acompletion(
            model=call.model,
            messages=cache_marked(call.messages) if marked else call.messages,
            api_base=self._api_base,
            api_key=self._api_key,
            timeout=self._timeout_s,
            num_retries=0,
            **self._call_params(call, mode),
        )
        return read_model_response(response)

    def _account(
        self, purpose: str, model: str, prompt: int, completion: int, cache: tuple[int, int] = (0, 0)
    ) -> None:
        """`cache`: the prompt tokens the provider read from its prompt cache and wrote to it, both
        part of `prompt` and each priced at its own rate."""
        read, written = cache
        counts = {"prompt": prompt, "completion": completion, "cache_read": read, "cache_write": written}
        for kind, count in counts.items():
            self._metrics.llm_tokens.labels(purpose, kind).inc(count)
        price = self._price(model)
        if price is not None:
            fresh = max(prompt - read - written, 0)
            cost = fresh * price[0] + completion * price[1] + read * price[2] + written * price[3]
            self._metrics.llm_cost.labels(purpose).inc(max(cost, 0.0))

    def priced(self, model: str) -> bool:
        """Whether litellm's cost map prices the model, so that a cost of 0 means free, not unknown."""
        return self._price(model) is not None

    def _price(self, model: str) -> tuple[float, float, float, float] | None:
        """USD per prompt, completion, cache-read and cache-write token from litellm's local cost
        map, looked up once per model; a model without cache rates pays the prompt rate for them.
        A model outside the map has no price, and its tokens are still counted."""
        if model not in self._prices:
            try:
                per_million = self._litellm.cost_per_token(
                    model=model, prompt_tokens=1_000_000, completion_tokens=1_000_000
                )
                prompt, completion = per_million[0] / 1e6, per_million[1] / 1e6
                info = self._litellm.get_model_info(model=model)
                read = info.get("cache_read_input_token_cost")
                written = info.get("cache_creation_input_token_cost")
                self._prices[model] = (prompt, completion, read or prompt, written or prompt)
            except Exception:
                self._prices[model] = None
        return self._prices[model]


async def _read_at_most(stream: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of a body as it arrives, decompressed, and whether that was all of it.
    aiohttp inflates as the body is read, so stopping here stops the inflation too."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream.iter_chunked(64 * 1024):
        chunks.append(chunk[: limit - size])
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), False
    return b"".join(chunks), True
