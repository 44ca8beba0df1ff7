"""JWTs as the platform issues them, and broken ones."""

from __future__ import annotations

import time

import jwt

SECRET = "test-jwt-secret-with-enough-entropy-0123456789"
INTERNAL = "test-internal-token-test-internal-token"


def token(
    user_id: int,
    permissions: list[str] | None = None,
    ttl_s: int = 3600,
    secret: str = SECRET,
    **claims: object,
) -> str:
    payload = {
        "sub": str(user_id),
        "permissions": permissions or [],
        "exp": int(time.time()) + ttl_s,
        **claims,
    }
    return jwt.encode(payload, secret, algorithm="HS256")


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}
