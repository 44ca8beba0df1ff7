"""`/api/v1/console/session`: the console's sign-in link carries a one-time code, never the token.

A browser writes every address it opens, fragment included, to the profile's history on disk. The
link `mao-memory run` prints therefore holds a code that is good for one exchange within ten
minutes; the token it is exchanged for stays in the tab's session storage.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.entrypoints.http.api_models import CamelModel
from service.entrypoints.http.envelope import ApiError, Envelope, error_responses, ok

CODE_LIFETIME_S = 600.0
REFUSED = "invalid sign-in code: unknown, already used or expired"


@dataclass(frozen=True, slots=True)
class _Code:
    value: bytes
    token: str
    expires: float


class SignInCodes:
    """Codes this process issued: each redeemable once before it expires, at most `capacity` alive."""

    def __init__(
        self,
        lifetime_s: float = CODE_LIFETIME_S,
        capacity: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lifetime_s = lifetime_s
        self._capacity = capacity
        self._clock = clock
        self._codes: list[_Code] = []

    def issue(self, token: str) -> str:
        now = self._clock()
        code = secrets.token_urlsafe(24)
        fresh = _Code(code.encode(), token, now + self._lifetime_s)
        self._codes = [*(c for c in self._codes if c.expires > now), fresh][-self._capacity :]
        return code

    def redeem(self, code: str) -> str | None:
        """The code's token, once; every live code is compared in constant time, none skipped."""
        now, given = self._clock(), code.encode()
        matches = [c for c in self._codes if hmac.compare_digest(c.value, given)]
        self._codes = [c for c in self._codes if c.expires > now and c not in matches]
        return next((c.token for c in matches if c.expires > now), None)


# `mao-memory run` without credentials issues the one code of its printed link here, in the process
# that serves the exchange; every other process answers every code with 401.
SIGN_IN_CODES = SignInCodes()


class SessionRequest(CamelModel):
    code: str = Field(min_length=1, max_length=64, description="the code after `#code=` in the link")


class Session(BaseModel):
    token: str = Field(description="the JWT the console sends as `Authorization: Bearer …`")


def console_router(codes: SignInCodes = SIGN_IN_CODES) -> APIRouter:
    router = APIRouter(prefix="/api/v1/console", tags=["console"], responses=error_responses(400, 401, 413))

    @router.post("/session", response_model=Envelope[Session])
    async def open_session(body: SessionRequest) -> dict[str, Any]:
        """Exchange the one-time code of the console link `mao-memory run` prints for its token.
        No bearer token: the code is the credential, good once within ten minutes."""
        token = codes.redeem(body.code)
        if token is None:
            raise ApiError(401, REFUSED)
        return ok({"token": token})

    return router
