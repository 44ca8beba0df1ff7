"""Classing a failed model call from what the provider did, whatever wrapped it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import httpx
import pytest

from service.adapters.llm_failures import (
    MAX_RETRY_AFTER_S,
    FailureClass,
    ProviderHttpError,
    classify,
    status_class,
)


def wrapped(inner: BaseException, outer: Exception) -> Exception:
    """`outer` raised while handling `inner`, as litellm wraps what its transport raised."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit context is the point
    except Exception as exc:
        return exc


class InternalServerError(Exception):
    """litellm's shape: status 500 whatever happened underneath."""

    status_code = 500


def http_status(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://model/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request)
    return httpx.HTTPStatusError("answered", request=request, response=response)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (429, FailureClass.OUTAGE),
        (500, FailureClass.OUTAGE),
        (599, FailureClass.OUTAGE),
        (408, FailureClass.EVENT),
        (409, FailureClass.EVENT),
        (425, FailureClass.EVENT),
        (302, FailureClass.EVENT),
        (400, FailureClass.REJECTED),
        (401, FailureClass.REJECTED),
        (404, FailureClass.REJECTED),
        (413, FailureClass.REJECTED),
        (422, FailureClass.REJECTED),
    ],
)
def test_each_status_has_its_class(status: int, expected: FailureClass) -> None:
    assert status_class(status) is expected
    assert classify(ProviderHttpError(status, "", {})).failure is expected
    assert classify(wrapped(http_status(status), InternalServerError("x"))).failure is expected


@pytest.mark.parametrize(
    ("inner", "expected", "kind"),
    [
        (http_status(503), FailureClass.OUTAGE, "error"),  # a real 500-class answer
        (httpx.ConnectError("refused"), FailureClass.OUTAGE, "error"),
        (httpx.ReadError("reset"), FailureClass.OUTAGE, "error"),
        (aiohttp.ClientPayloadError("cut"), FailureClass.OUTAGE, "error"),
        (ConnectionResetError(), FailureClass.OUTAGE, "error"),
        (httpx.ReadTimeout("slow"), FailureClass.EVENT, "timeout"),
        (ValueError("Expecting value: line 1 column 1"), FailureClass.EVENT, "error"),  # an unreadable 2xx
        (KeyError("content"), FailureClass.EVENT, "error"),
    ],
)
def test_litellms_500_is_told_apart_by_what_it_wraps(
    inner: BaseException, expected: FailureClass, kind: str
) -> None:
    error = classify(wrapped(inner, InternalServerError("InternalServerError")))
    assert (error.failure, error.kind) == (expected, kind)


def test_a_refusal_before_sending_is_a_rejection() -> None:
    class UnsupportedParamsError(Exception):
        status_code = 400

    error = classify(UnsupportedParamsError("temperature=0"))
    assert (error.failure, error.status, error.retryable) == (FailureClass.REJECTED, 400, False)


def test_a_timeout_is_an_event_failure() -> None:
    error = classify(TimeoutError())
    assert (error.failure, error.kind, error.retryable) == (FailureClass.EVENT, "timeout", True)


def in_seconds(seconds: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("value", "low", "high"),
    [
        ("2", 2, 2),
        ("0.25", 0.25, 0.25),
        ("-5", 0, 0),
        ("3600", MAX_RETRY_AFTER_S, MAX_RETRY_AFTER_S),
    ],
)
def test_retry_after_in_seconds_is_honoured_up_to_the_cap(value: str, low: float, high: float) -> None:
    error = classify(ProviderHttpError(429, "", {"retry-after": value}))
    assert error.retry_after is not None and low <= error.retry_after <= high


@pytest.mark.parametrize(("ahead", "low", "high"), [(10, 8, 10), (-60, 0, 0), (3600, 30, 30)])
def test_retry_after_as_a_date_is_honoured_up_to_the_cap(ahead: float, low: float, high: float) -> None:
    error = classify(ProviderHttpError(503, "", {"retry-after": in_seconds(ahead)}))
    assert error.retry_after is not None and low <= error.retry_after <= high


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "", "Wed, 99 Foo 2015"])
def test_a_retry_after_that_says_nothing_usable_is_absent(value: str) -> None:
    assert classify(ProviderHttpError(503, "", {"retry-after": value})).retry_after is None


SECRET = "我有高血压,饮食清淡"


@pytest.mark.parametrize(
    "exc",
    [
        ProviderHttpError(400, f'{{"error": {{"message": "refused: {SECRET}"}}}}', {}),
        wrapped(ProviderHttpError(503, SECRET, {}), InternalServerError(f"litellm: {SECRET}")),
        wrapped(aiohttp.ClientConnectionError(SECRET), InternalServerError(SECRET)),
        TimeoutError(SECRET),
        ValueError(f"could not parse {SECRET}"),
    ],
    ids=["rejected", "wrapped-5xx", "connection", "timeout", "unreadable"],
)
def test_what_logs_carry_of_a_failure_never_quotes_the_provider(exc: Exception) -> None:
    """The provider's text may quote the conversation: the dead letter keeps it, logs never do."""
    error = classify(exc)
    assert SECRET not in error.safe and len(error.safe) <= 200
    assert error.safe.startswith(error.kind)
    assert type(exc).__name__ in error.safe
    assert SECRET in error.detail  # still there for the dead letter's header
    if error.status is not None:
        assert f"HTTP {error.status}" in error.safe
