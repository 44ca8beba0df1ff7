"""What a failed model call means, decided from what the provider did, never from how a library
wrapped it: one event the model always fails on must not look like an outage, and an outage must
not look like a bad event.

- OUTAGE: a connection refused, reset or cut mid-answer, a 5xx, a 429. Retried within the call
  with back-off that honours Retry-After. `kind` "error".
- EVENT: a timeout, 408, 409, 425, a 2xx without a usable message (no `choices`, content that is
  not text, an empty or non-JSON body), any other status no call should get. Not retried within
  the call. `kind` "timeout" (a timeout, 408) or "error".
- REJECTED: any other 4xx (unknown model, bad key, context too long, a parameter litellm refuses
  before sending). Never retried. `kind` "rejected".

OUTAGE looks systemic and EVENT looks like this call's own trouble, but either may be the other:
the circuit breaker tells them apart by counting different callers. REJECTED is a setting to fix.

litellm reports a body it could not parse, a refused connection and a real HTTP 500 all as
`InternalServerError` with status 500; the status the provider really sent is on the
`httpx.HTTPStatusError` in the exception's chain, and a transport failure is an httpx or aiohttp
connection error in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

import aiohttp
import httpx

MAX_RETRY_AFTER_S = 30.0
MAX_SAFE = 200  # characters of `LlmError.safe`
EVENT_STATUSES = frozenset({408, 409, 425})  # timeout, conflict, too early: about this request
_TRANSPORT = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    httpx.TransportError,
    ConnectionError,
)


class FailureClass(StrEnum):
    OUTAGE = "outage"
    EVENT = "event"
    REJECTED = "rejected"


class LlmError(Exception):
    """The call produced no answer. `kind` is the metric label (timeout, error, rejected,
    unavailable); `failure` the class above; `retryable` means "not rejected".

    `detail` may hold the provider's own text, which can quote the conversation: it goes to the
    dead letter's header only. `safe` is what logs carry: the kind, the status and the exception
    types, or a fixed sentence of the client's (`unusable`), never a word of the provider's.
    """

    def __init__(
        self,
        kind: str,
        detail: str,
        failure: FailureClass,
        status: int | None = None,
        retry_after: float | None = None,
        safe: str = "",
    ) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.failure = failure
        self.status = status
        self.retry_after = retry_after
        self.safe = " ".join(p for p in (kind, f"HTTP {status}" if status else "", safe) if p)[:MAX_SAFE]
        # Set by the client on a failure: a call that started later was answered while this one
        # was out (`failure_budget`).
        self.overtaken = False

    @property
    def retryable(self) -> bool:
        return self.failure is not FailureClass.REJECTED


class ProviderHttpError(Exception):
    """A non-2xx answer on the shared session."""

    def __init__(self, status: int, body: str, headers: Any) -> None:
        super().__init__(body)
        self.status_code = status
        self.headers = headers


def status_class(status: int) -> FailureClass:
    if status == 429 or status >= 500:
        return FailureClass.OUTAGE
    if 400 <= status < 500 and status not in EVENT_STATUSES:
        return FailureClass.REJECTED
    return FailureClass.EVENT  # 408, 409, 425, and a final 1xx/3xx no call should get


def unusable(problem: str) -> LlmError:
    """A 2xx whose body holds no message: this call's trouble, not the provider's. `problem` is one
    of the client's own sentences, so it is safe to log."""
    return LlmError("error", problem, FailureClass.EVENT, safe=problem)


def classify(exc: BaseException) -> LlmError:
    chain = list(_chain(exc))
    detail = f"{type(exc).__name__}: {exc}"[:1000]
    types = "<".join(dict.fromkeys(type(link).__name__ for link in chain))
    for link in chain:
        status, headers = _http_answer(link)
        if status is not None:
            failure = status_class(status)
            kind = "timeout" if status == 408 else "rejected" if failure is FailureClass.REJECTED else "error"
            retry_after = _retry_after(headers)
            return LlmError(kind, f"HTTP {status} {detail}"[:1000], failure, status, retry_after, types)
    if any(isinstance(link, (TimeoutError, httpx.TimeoutException)) for link in chain):
        return LlmError("timeout", detail, FailureClass.EVENT, safe=types)
    if any(isinstance(link, _TRANSPORT) for link in chain):
        return LlmError("error", detail, FailureClass.OUTAGE, safe=types)
    own = getattr(exc, "status_code", None)  # litellm refused the call before sending it
    if isinstance(own, int) and status_class(own) is FailureClass.REJECTED:
        return LlmError("rejected", f"HTTP {own} {detail}"[:1000], FailureClass.REJECTED, own, safe=types)
    # An answer arrived that litellm could not read.
    return LlmError("error", detail, FailureClass.EVENT, safe=types)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < 32:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _http_answer(link: BaseException) -> tuple[int | None, Any]:
    """The status and headers the provider really sent, if this link carries them."""
    if isinstance(link, ProviderHttpError):
        return link.status_code, link.headers
    if isinstance(link, httpx.HTTPStatusError):
        return link.response.status_code, link.response.headers
    return None, None


def _retry_after(headers: Any) -> float | None:
    """Retry-After in seconds or as an HTTP date, capped; anything else counts as absent."""
    value = headers.get("retry-after") if headers else None
    if value is None:
        return None
    seconds: float | None
    try:
        seconds = float(value)
    except ValueError:
        seconds = _seconds_until(value)
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def _seconds_until(date: str) -> float | None:
    try:
        when = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()
