"""Bearer credentials: a verified HS256 JWT for `/api/**`, the internal token for `/internal/**`."""

from __future__ import annotations

import hmac
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Annotated, Any

import jwt
from fastapi import Depends, Request
from jwt import exceptions as jwt_errors

from service.config import Settings
from service.core.events import ID_PATTERN
from service.entrypoints.http.envelope import ApiError
from service.entrypoints.tokens import ADMIN_PERMISSION, READ_PERMISSION

# One 401 message per cause (docs/api.md lists them). The configuration is checked before the
# request, so a caller never chases a token problem on a service that accepts none.
NOT_CONFIGURED = "authentication is not configured: the service has no MEMORY_JWT_SECRET"
INTERNAL_NOT_CONFIGURED = "the internal API is not configured: the service has no MEMORY_INTERNAL_TOKEN"
MISSING = "missing credentials: send Authorization: Bearer <token>"
TWO_CREDENTIALS = "two Authorization headers: send one"
WRONG_INTERNAL = "invalid internal token"
# No issuer writes an exp, nbf or iat further ahead than this; PyJWT alone takes exp = 10**30.
MAX_CLAIM_AHEAD_S = 5 * 366 * 24 * 3600
TIME_CLAIMS = ("exp", "nbf", "iat")


class DuplicateKey(jwt_errors.DecodeError):
    """A key twice in the header or the payload: PyJWT's parser keeps the last, another parser the
    first (`{"alg": "none", "alg": "HS256"}` reads as `none` elsewhere)."""


class BadClaimTime(jwt_errors.InvalidTokenError):
    """exp, nbf or iat is not a JSON number of seconds within range."""


_JWT_REASONS: list[tuple[type[jwt.PyJWTError], str]] = [
    (DuplicateKey, "invalid token: a key appears twice"),
    (BadClaimTime, "invalid token: exp, nbf and iat must be numbers of seconds, at most 5 years ahead"),
    (jwt_errors.ExpiredSignatureError, "invalid token: expired"),
    (jwt_errors.ImmatureSignatureError, "invalid token: not valid yet"),
    (jwt_errors.InvalidSignatureError, "invalid token: signature does not match"),
    (jwt_errors.InvalidSubjectError, 'invalid token: sub must be the user id as a string, such as "42"'),
    (jwt_errors.MissingRequiredClaimError, "invalid token: exp and sub are required"),
    (jwt_errors.InvalidIssuerError, "invalid token: wrong issuer"),
    (jwt_errors.InvalidAudienceError, "invalid token: wrong audience"),
    (jwt_errors.InvalidAlgorithmError, "invalid token: only HS256 is accepted"),
    (jwt_errors.DecodeError, "invalid token: not a JWT"),
]


def _reason(error: jwt.PyJWTError | None) -> str:
    if isinstance(error, jwt_errors.MissingRequiredClaimError) and error.claim in {"iss", "aud"}:
        return f"invalid token: {error.claim} is required"
    return next((text for kind, text in _JWT_REASONS if isinstance(error, kind)), "invalid token")


def claim_times_valid(claims: dict[str, object], now: float) -> bool:
    """exp, nbf and iat, where present, are JSON numbers (not strings, not booleans) between the
    epoch and `MAX_CLAIM_AHEAD_S` from `now`."""
    for name in TIME_CLAIMS:
        if name not in claims:
            continue
        value = claims[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        # An int is compared as it is: `isfinite` overflows on one beyond a float (10**400).
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if not 0 <= value <= now + MAX_CLAIM_AHEAD_S:
            return False
    return True


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    claims = dict(pairs)
    if len(claims) != len(pairs):
        raise DuplicateKey("a key appears twice")
    return claims


class _StrictJws(jwt.PyJWS):
    """PyJWS, refusing a JOSE header that names a key twice, before the header is used."""

    def _load(self, jwt: str | bytes) -> tuple[bytes, bytes, dict[str, Any], bytes]:
        loaded = super()._load(jwt)
        raw = jwt.encode() if isinstance(jwt, str) else jwt
        header = self._decode_base64url_segment(raw.split(b".", 1)[0], "header")
        json.loads(header, object_pairs_hook=_unique_keys)
        return loaded


class _StrictJwt(jwt.PyJWT):
    """PyJWT, reading the header and the payload strictly before it checks the claims: duplicate
    keys refused, time claims held to `claim_times_valid` (PyJWT itself calls `int()` on them, which
    takes "1900000000" and any size)."""

    def __init__(self) -> None:
        super().__init__()
        self._jws = _StrictJws(options=self._get_sig_options())

    def _decode_payload(self, decoded: dict[str, object]) -> dict[str, object]:
        try:
            payload = json.loads(decoded["payload"], object_pairs_hook=_unique_keys)  # type: ignore[arg-type]
        except (ValueError, RecursionError) as exc:
            raise jwt_errors.DecodeError(f"invalid payload: {exc}") from exc
        if not isinstance(payload, dict):
            raise jwt_errors.DecodeError("the payload is not a JSON object")
        if not claim_times_valid(payload, time.time()):
            raise BadClaimTime("exp, nbf or iat out of range")
        return payload


_JWT = _StrictJwt()


@dataclass(frozen=True, slots=True)
class Caller:
    user_id: int
    permissions: frozenset[str]


def _bearer(request: Request) -> str:
    headers = request.headers.getlist("authorization")
    if len(headers) > 1:
        raise ApiError(401, TWO_CREDENTIALS)
    header = headers[0] if headers else ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, MISSING)
    return token.strip()


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self._secrets = [
            s.get_secret_value() for s in (settings.jwt_secret, settings.jwt_previous_secret) if s
        ]
        self._issuer = settings.jwt_issuer
        self._audience = settings.jwt_audience
        self._leeway = settings.jwt_leeway_s
        self._internal = (
            settings.internal_token.get_secret_value().encode() if settings.internal_token else None
        )

    def caller(self, request: Request) -> Caller:
        if not self._secrets:
            raise ApiError(401, NOT_CONFIGURED)
        token = _bearer(request)
        claims = self._verify(token)
        return Caller(_user_id(claims.get("sub")), _permissions(claims.get("permissions")))

    def _verify(self, token: str) -> dict[str, object]:
        """HS256 only (never `none`), `exp` and `sub` required; the previous secret eases rotation."""
        options = {"require": ["exp", "sub"], "verify_aud": self._audience is not None}
        error: jwt.PyJWTError | None = None
        for secret in self._secrets:
            try:
                claims: dict[str, object] = _JWT.decode(
                    token,
                    secret,
                    algorithms=["HS256"],
                    issuer=self._issuer,
                    audience=self._audience,
                    leeway=self._leeway,
                    options=options,  # type: ignore[arg-type]
                )
                return claims
            except jwt.InvalidSignatureError as exc:
                error = exc  # maybe signed with the other secret
            except jwt.PyJWTError as exc:
                raise ApiError(401, _reason(exc)) from None
        raise ApiError(401, _reason(error))

    def internal(self, request: Request) -> None:
        if self._internal is None:
            raise ApiError(401, INTERNAL_NOT_CONFIGURED)
        token = _bearer(request).encode()
        if not hmac.compare_digest(token, self._internal):
            raise ApiError(401, WRONG_INTERNAL)


_USER_ID = re.compile(ID_PATTERN)


def _user_id(sub: object) -> int:
    """The canonical decimal form only: "042" and "+42" name user 42 to `int()` but are not how any
    issuer writes it, and another reader of the same token might not take them for 42."""
    if not isinstance(sub, str) or _USER_ID.fullmatch(sub) is None:
        raise ApiError(401, 'invalid token: sub must be the user id as a string, such as "42"')
    return int(sub)


def _permissions(value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ApiError(401, "invalid token: permissions must be a list of strings")
    return frozenset(value)


def require(caller: Caller, permission: str) -> None:
    if permission not in caller.permissions:
        raise ApiError(403, f"permission {permission} required")


async def current_caller(request: Request) -> Caller:
    """FastAPI dependency: the verified caller of an `/api/**` request (async: no thread hop)."""
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator.caller(request)


async def audit_reader(request: Request) -> Caller:
    """FastAPI dependency: a caller holding `memory:read`."""
    caller = await current_caller(request)
    require(caller, READ_PERMISSION)
    return caller


async def settings_admin(request: Request) -> Caller:
    """FastAPI dependency: a caller holding `memory:admin` (changes system settings)."""
    caller = await current_caller(request)
    require(caller, ADMIN_PERMISSION)
    return caller


async def internal_caller(request: Request) -> None:
    """FastAPI dependency: the harness, holding the internal token."""
    authenticator: Authenticator = request.app.state.authenticator
    authenticator.internal(request)


Me = Annotated[Caller, Depends(current_caller)]
Reader = Annotated[Caller, Depends(audit_reader)]
Admin = Annotated[Caller, Depends(settings_admin)]
