"""Bearer credentials: a verified HS256 JWT for `/api/**`, the internal token for `/internal/**`."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

import jwt
from fastapi import Depends, Request
from jwt import exceptions as jwt_errors

from service.config import Settings
from service.core.events import BIGINT_MAX
from service.entrypoints.http.envelope import ApiError

READ_PERMISSION = "memory:read"
ADMIN_PERMISSION = "memory:admin"

# One 401 message per cause (docs/api.md lists them). The configuration is checked before the
# request, so a caller never chases a token problem on a service that accepts none.
NOT_CONFIGURED = "authentication is not configured: the service has no MEMORY_JWT_SECRET"
INTERNAL_NOT_CONFIGURED = "the internal API is not configured: the service has no MEMORY_INTERNAL_TOKEN"
MISSING = "missing credentials: send Authorization: Bearer <token>"
WRONG_INTERNAL = "invalid internal token"
_JWT_REASONS: list[tuple[type[jwt.PyJWTError], str]] = [
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
    return next((text for kind, text in _JWT_REASONS if isinstance(error, kind)), "invalid token")


@dataclass(frozen=True, slots=True)
class Caller:
    user_id: int
    permissions: frozenset[str]


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
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
                claims: dict[str, object] = jwt.decode(
                    token,
                    secret,
                    algorithms=["HS256"],
                    issuer=self._issuer,
                    audience=self._audience,
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


def mint_token(settings: Settings, user_id: int, admin: bool, lifetime: timedelta) -> str:
    """A token this service accepts (`mao-memory dev-token`, the throwaway run): sub as a string,
    iss/aud when configured."""
    assert settings.jwt_secret is not None
    claims: dict[str, object] = {
        "sub": str(user_id),
        "exp": int((datetime.now(UTC) + lifetime).timestamp()),
        "permissions": [READ_PERMISSION, ADMIN_PERMISSION] if admin else [],
    }
    if settings.jwt_issuer:
        claims["iss"] = settings.jwt_issuer
    if settings.jwt_audience:
        claims["aud"] = settings.jwt_audience
    return jwt.encode(claims, settings.jwt_secret.get_secret_value(), algorithm="HS256")


def _user_id(sub: object) -> int:
    text = str(sub)
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= BIGINT_MAX:
        raise ApiError(401, 'invalid token: sub must be the user id as a string, such as "42"')
    return int(text)


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
