"""The JWTs this service accepts, minted for local use (`mao-memory dev-token`, a throwaway run).

Kept apart from the HTTP side so the command line signs a token without importing the web stack.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jwt

from service.config import Settings

READ_PERMISSION = "memory:read"
ADMIN_PERMISSION = "memory:admin"


def mint_token(settings: Settings, user_id: int, admin: bool, lifetime: timedelta) -> str:
    """A token this service accepts: sub as a string, iss/aud when configured."""
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
