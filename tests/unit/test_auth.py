"""Token verification: rotation through the previous secret, issuer and audience, malformed claims."""

from __future__ import annotations

import time

import jwt
import pytest
from starlette.requests import Request

from service.config import Settings
from service.entrypoints.http.auth import Authenticator
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
