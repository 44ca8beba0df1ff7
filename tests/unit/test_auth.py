"""Token verification: rotation through the previous secret, issuer and audience, malformed claims."""

from __future__ import annotations

import time
from collections.abc import Callable

import jwt
import pytest
from starlette.requests import Request

from service.config import Settings
from service.entrypoints.http.auth import INTERNAL_NOT_CONFIGURED, MISSING, NOT_CONFIGURED, Authenticator
from service.entrypoints.http.envelope import ApiError

NEW, OLD = "new-secret-new-secret-new-secret-0123456789", "old-secret-old-secret-old-secret-0123456789"


def request(token: str) -> Request:
    return Request({"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]})


def signed(secret: str, **claims: object) -> str:
    return jwt.encode({"sub": "42", "exp": int(time.time()) + 60, **claims}, secret, algorithm="HS256")


def auth(**settings: object) -> Authenticator:
    return Authenticator(Settings(_env_file=None, jwt_secret=NEW, **settings))  # type: ignore[arg-type, call-arg]


def test_tokens_of_the_previous_secret_pass_during_rotation() -> None:
    assert auth(jwt_previous_secret=OLD).caller(request(signed(OLD))).user_id == 42
    assert auth(jwt_previous_secret=OLD).caller(request(signed(NEW))).user_id == 42
    with pytest.raises(ApiError) as refused:
        auth().caller(request(signed(OLD)))
    assert refused.value.status == 401


def test_issuer_and_audience_are_checked_when_configured() -> None:
    strict = auth(jwt_issuer="mao", jwt_audience="memory")
    assert strict.caller(request(signed(NEW, iss="mao", aud="memory"))).user_id == 42
    for claims in ({"iss": "other", "aud": "memory"}, {"iss": "mao", "aud": "other"}, {}):
        with pytest.raises(ApiError):
            strict.caller(request(signed(NEW, **claims)))


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "abc"},
        {"sub": "0"},
        {"sub": str(2**63)},
        {"sub": "٤٢"},
        {"permissions": "memory:read"},
        {"permissions": [1]},
    ],
)
def test_malformed_claims_are_401(claims: dict[str, object]) -> None:
    with pytest.raises(ApiError) as refused:
        auth().caller(request(signed(NEW, **claims)))
    assert refused.value.status == 401


def refusal(authenticator: Authenticator, req: Request, internal: bool = False) -> str:
    with pytest.raises(ApiError) as refused:
        authenticator.internal(req) if internal else authenticator.caller(req)
    assert refused.value.status == 401
    return refused.value.message


# Tokens are made when the test runs, not when it is collected: a long suite would expire them first.
@pytest.mark.parametrize(
    ("token", "message"),
    [
        (lambda: signed(NEW, exp=int(time.time()) - 10), "invalid token: expired"),
        (lambda: signed(NEW, nbf=int(time.time()) + 600), "invalid token: not valid yet"),
        (lambda: signed(OLD), "invalid token: signature does not match"),
        (lambda: signed(NEW, sub=42), 'invalid token: sub must be the user id as a string, such as "42"'),
        (lambda: signed(NEW, sub="abc"), 'invalid token: sub must be the user id as a string, such as "42"'),
        (
            lambda: jwt.encode({"sub": "42"}, NEW, algorithm="HS256"),
            "invalid token: exp and sub are required",
        ),
        (lambda: signed(NEW).replace(".", "", 1), "invalid token: not a JWT"),
        (
            lambda: jwt.encode({"sub": "42", "exp": int(time.time()) + 60}, NEW * 2, algorithm="HS512"),
            "invalid token: only HS256 is accepted",
        ),
    ],
)
def test_each_cause_has_one_message(token: Callable[[], str], message: str) -> None:
    assert refusal(auth(), request(token())) == message


def test_an_unconfigured_service_says_so_before_looking_at_the_request() -> None:
    bare = Authenticator(Settings(_env_file=None))  # type: ignore[call-arg]
    no_header = Request({"type": "http", "headers": []})
    assert refusal(bare, no_header) == refusal(bare, request(signed(NEW))) == NOT_CONFIGURED
    assert refusal(bare, request("x"), internal=True) == INTERNAL_NOT_CONFIGURED
    assert refusal(auth(), no_header) == MISSING
    assert refusal(auth(internal_token="t-1"), request("t-2"), internal=True) == "invalid internal token"
