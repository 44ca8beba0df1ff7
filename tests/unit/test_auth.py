"""Token verification: rotation through the previous secret, issuer and audience, malformed claims."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable

import jwt
import pytest
from pydantic import ValidationError
from starlette.requests import Request

from service.config import Settings
from service.entrypoints.http.auth import (
    INTERNAL_NOT_CONFIGURED,
    MISSING,
    NOT_CONFIGURED,
    TWO_CREDENTIALS,
    Authenticator,
)
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


def test_clock_skew_within_the_leeway_is_forgiven() -> None:
    """An identity provider's clock a little ahead (iat, nbf) or a token just expired passes within
    MEMORY_JWT_LEEWAY_S (default 30 s); beyond it, or with no leeway, it is refused."""
    now = int(time.time())
    ahead = signed(NEW, iat=now + 2, nbf=now + 2)
    assert auth().caller(request(ahead)).user_id == 42
    assert auth().caller(request(signed(NEW, exp=now - 10))).user_id == 42
    assert refusal(auth(), request(signed(NEW, exp=now - 60))) == "invalid token: expired"
    assert refusal(auth(jwt_leeway_s=0), request(ahead)) == "invalid token: not valid yet"
    assert refusal(auth(jwt_leeway_s=0), request(signed(NEW, exp=now - 10))) == "invalid token: expired"


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "abc"},
        {"sub": "0"},
        {"sub": str(2**63)},
        {"sub": "٤٢"},
        {"sub": "042"},  # user 42 to int(), not the canonical form
        {"sub": "+42"},
        {"sub": "42\n"},
        {"sub": " 42"},
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
        (lambda: signed(NEW, exp=int(time.time()) - 60), "invalid token: expired"),
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
    internal = auth(internal_token="t" * 32 + "1")
    assert refusal(internal, request("t" * 32 + "2"), internal=True) == "invalid internal token"


def forged(payload: bytes, secret: str = NEW) -> str:
    """A correctly signed token around a payload written by hand (duplicate keys, strings, NaN)."""
    return jwt.api_jws.encode(payload, secret, algorithm="HS256")


@pytest.mark.parametrize(
    "payload",
    [
        '{"sub": "42", "exp": "%(later)d"}',  # a digit string, which int() would take
        '{"sub": "42", "exp": 1000000000000000000000000000000}',
        '{"sub": "42", "exp": 1%(zeros)s}',  # 10**400: beyond a float
        '{"sub": "42", "exp": %(far)d}',  # more than five years ahead
        '{"sub": "42", "exp": true}',
        '{"sub": "42", "exp": NaN}',
        '{"sub": "42", "exp": %(later)d, "nbf": "0"}',
        '{"sub": "42", "exp": %(later)d, "iat": -1}',
        '{"sub": "42", "exp": %(later)d, "iat": [1]}',
    ],
)
def test_time_claims_must_be_json_numbers_within_range(payload: str) -> None:
    now = int(time.time())
    text = payload % {"later": now + 600, "far": now + 6 * 366 * 24 * 3600, "zeros": "0" * 400}
    assert refusal(auth(), request(forged(text.encode()))).startswith("invalid token: exp, nbf and iat")


def test_time_claims_as_numbers_within_range_pass() -> None:
    now = time.time()
    fine = signed(NEW, exp=now + 4 * 365 * 24 * 3600, nbf=int(now) - 5, iat=now - 5)
    assert auth().caller(request(fine)).user_id == 42


def test_a_key_given_twice_in_the_payload_or_the_header_is_refused() -> None:
    later = int(time.time()) + 600
    twice = f'{{"sub": "1", "sub": "42", "exp": {later}}}'.encode()
    assert refusal(auth(), request(forged(twice))) == "invalid token: a key appears twice"
    nested = f'{{"sub": "42", "exp": {later}, "x": {{"a": 1, "a": 2}}}}'.encode()
    assert refusal(auth(), request(forged(nested))) == "invalid token: a key appears twice"
    valid = forged(f'{{"sub": "42", "exp": {later}}}'.encode())
    _, payload, _ = valid.split(".")
    header = base64url('{"alg": "none", "alg": "HS256", "typ": "JWT"}')
    signature = base64url(hmac.new(NEW.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest())
    assert refusal(auth(), request(f"{header}.{payload}.{signature}")) == "invalid token: a key appears twice"


def base64url(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_two_authorization_headers_are_refused() -> None:
    good = signed(NEW)
    both = Request({"type": "http", "headers": [(b"authorization", f"Bearer {good}".encode())] * 2})
    assert refusal(auth(), both) == TWO_CREDENTIALS
    assert refusal(auth(internal_token="t" * 32), both, internal=True) == TWO_CREDENTIALS


def test_a_configured_issuer_or_audience_is_required_in_the_token() -> None:
    assert refusal(auth(jwt_issuer="mao"), request(signed(NEW))) == "invalid token: iss is required"
    assert refusal(auth(jwt_audience="memory"), request(signed(NEW))) == "invalid token: aud is required"
    assert refusal(auth(jwt_issuer="mao"), request(signed(NEW, iss="other"))) == "invalid token: wrong issuer"
    assert auth(jwt_issuer="", jwt_audience="").caller(request(signed(NEW))).user_id == 42  # empty: unset


@pytest.mark.parametrize("variable", ["jwt_secret", "jwt_previous_secret", "internal_token"])
def test_a_secret_shorter_than_32_bytes_is_refused(variable: str) -> None:
    """The internal token too: a short one is guessed against the service in a few requests."""
    with pytest.raises(ValidationError, match="at least 32 bytes"):
        Settings(_env_file=None, **{variable: "s" * 31})  # type: ignore[call-arg]
    assert Settings(_env_file=None, **{variable: "s" * 32}) is not None  # type: ignore[call-arg]
    assert getattr(Settings(_env_file=None, **{variable: ""}), variable) is None  # type: ignore[call-arg]
