"""Bearer credentials: a verified HS256 JWT for `/api/**`, the internal token for `/internal/**`."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

import jwt
from fastapi import Depends, Request

from service.config import Settings
from service.core.events import BIGINT_MAX
from service.entrypoints.http.envelope import ApiError

READ_PERMISSION = "memory:read"
ADMIN_PERMISSION = "memory:admin"


@dataclass(frozen=True, slots=True)
class Caller:
    user_id: int
    permissions: frozenset[str]


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing bearer token")
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
        token = _bearer(request)
        if not self._secrets:
            raise ApiError(401, "authentication is not configured")
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
                raise ApiError(401, f"invalid token: {type(exc).__name__}") from None
        raise ApiError(401, f"invalid token: {type(error).__name__}")

    def internal(self, request: Request) -> None:
        token = _bearer(request).encode()
        if self._internal is None or not hmac.compare_digest(token, self._internal):
            raise ApiError(401, "invalid internal token")


def _user_id(sub: object) -> int:
    text = str(sub)
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= BIGINT_MAX:
        raise ApiError(401, "invalid token: sub is not a user id")
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
