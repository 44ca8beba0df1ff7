"""The model call through litellm: one timeout, our own bounded retries, latency and token metrics.

litellm's built-in retries multiply the timeout, so they are off (`num_retries=0`) and retries
happen here: only on 429, 5xx and refused connections, with back-off that honours Retry-After.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from service.adapters.metrics import Metrics

MAX_RETRY_AFTER_S = 30.0


class LlmError(Exception):
    """The call produced no usable answer; `kind` is the metric label (timeout or error)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True, slots=True)
class LlmAnswer:
    text: str
    model: str


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
    ) -> None:
        self._litellm = import_litellm()
        self._metrics = metrics
        self._api_base = api_base
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._retry_base_s = retry_base_s

    async def complete(self, purpose: str, model: str, messages: list[dict[str, str]]) -> LlmAnswer:
        attempt = 0
        while True:
            try:
                return await self._once(purpose, model, messages)
            except LlmError:
                raise
            except Exception as exc:
                delay = self._retry_delay(exc, attempt)
                if delay is None or attempt >= self._max_retries:
                    self._metrics.llm_calls.labels(purpose, _error_kind(exc)).inc()
                    raise LlmError(_error_kind(exc), f"{type(exc).__name__}: {exc}") from exc
                self._metrics.llm_retries.labels(purpose).inc()
                attempt += 1
                await asyncio.sleep(delay)

    async def _once(self, purpose: str, model: str, messages: list[dict[str, str]]) -> LlmAnswer:
        started = time.perf_counter()
        try:
            response = await self._litellm.acompletion(
                model=model,
                messages=messages,
                api_base=self._api_base,
                api_key=self._api_key,
                timeout=self._timeout_s,
                num_retries=0,
                temperature=0,
            )
        finally:
            self._metrics.llm_latency.labels(purpose).observe(time.perf_counter() - started)
        usage = getattr(response, "usage", None)
        if usage is not None:
            self._metrics.llm_tokens.labels(purpose, "prompt").inc(getattr(usage, "prompt_tokens", 0) or 0)
            self._metrics.llm_tokens.labels(purpose, "completion").inc(
                getattr(usage, "completion_tokens", 0) or 0
            )
        try:
            text = response.choices[0].message.content
        except (AttributeError, IndexError, TypeError) as exc:
            self._metrics.llm_calls.labels(purpose, "error").inc()
            raise LlmError("error", "answer without a message") from exc
        return LlmAnswer(text=text or "", model=model)

    def _retry_delay(self, exc: Exception, attempt: int) -> float | None:
        """None when retrying cannot help (a timeout, a 4xx other than 429, a malformed request)."""
        if _error_kind(exc) == "timeout":
            return None
        status = getattr(exc, "status_code", None)
        connection = type(exc).__name__ == "APIConnectionError"
        if not connection and not (status == 429 or (isinstance(status, int) and status >= 500)):
            return None
        retry_after = _retry_after(exc)
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        return float(self._retry_base_s * (2**attempt) * (0.5 + random.random()))


def _error_kind(exc: BaseException) -> str:
    name = type(exc).__name__
    return "timeout" if "Timeout" in name or isinstance(exc, TimeoutError) else "error"


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
