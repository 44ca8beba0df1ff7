"""Every endpoint × {no token, bad signature, expired, other user, missing permission, right caller}."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import jwt
import pytest

from tests.integration.http.conftest import As, internal_headers
from tests.support.tokens import SECRET, bearer, token


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # {id} = the owner's memory, {user} = the owner's user id
    body: dict[str, object] | None = None
    item: bool = False  # addresses one memory: another user gets 404
    admin: str | None = None  # the permission it needs
    internal: bool = False  # takes the internal token, not a JWT

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


ENDPOINTS = [
    Endpoint("GET", "/api/v1/memory"),
    Endpoint("POST", "/api/v1/memory", {"scope": "USER", "content": "矩阵新增"}),
    Endpoint("PATCH", "/api/v1/memory/{id}", {"content": "矩阵改写"}, item=True),
    Endpoint("PATCH", "/api/v1/memory/{id}", {"status": "DISMISSED"}, item=True),
    Endpoint("GET", "/api/v1/memory/{id}/history", item=True),
    Endpoint("DELETE", "/api/v1/memory/{id}", item=True),
    Endpoint("GET", "/api/v1/memory/settings"),
    Endpoint("PATCH", "/api/v1/memory/settings", {"autoCaptureEnabled": True}),
    Endpoint("GET", "/api/v1/memory/projects"),
    Endpoint("GET", "/api/v1/admin/memory?userId={user}", admin="memory:read"),
    Endpoint("GET", "/api/v1/admin/memory/{id}/history?userId={user}", admin="memory:read"),
    Endpoint("GET", "/api/v1/admin/memory/extractions?userId={user}", admin="memory:read"),
    Endpoint("GET", "/api/v1/admin/memory/settings", admin="memory:read"),
    Endpoint("GET", "/api/v1/admin/memory/quality", admin="memory:read"),
    Endpoint("PUT", "/api/v1/admin/memory/settings", {"extractionModelId": ""}, admin="memory:admin"),
    Endpoint("GET", "/internal/v1/memory/injection?userId={user}", internal=True),
]

CREDENTIALS = [
    "none",
    "bad_signature",
    "expired",
    "no_exp",
    "alg_none",
    "other_user",
    "no_permission",
    "right",
]


def headers_for(credential: str, owner: int, endpoint: Endpoint) -> dict[str, str]:
    permissions = [endpoint.admin] if endpoint.admin else []
    match credential:
        case "none":
            return {}
        case "bad_signature":
            return bearer(token(owner, permissions, secret="not-the-secret-but-long-enough-0123456789"))
        case "expired":
            return bearer(token(owner, permissions, ttl_s=-60))  # beyond the leeway
        case "no_exp":
            return bearer(
                jwt.encode({"sub": str(owner), "permissions": permissions}, SECRET, algorithm="HS256")
            )
        case "alg_none":
            claims = {"sub": str(owner), "permissions": permissions, "exp": int(time.time()) + 60}
            return bearer(jwt.encode(claims, None, algorithm="none"))
        case "other_user":
            return bearer(token(owner + 10**12, permissions))
        case "no_permission":
            # memory:read is not enough where memory:admin is needed
            return bearer(token(owner, ["memory:read"] if endpoint.admin == "memory:admin" else []))
        case _:
            return internal_headers() if endpoint.internal else bearer(token(owner, permissions))


def expected(credential: str, endpoint: Endpoint) -> int:
    if credential in {"none", "bad_signature", "expired", "no_exp", "alg_none"}:
        return 401
    if endpoint.internal:
        return 200 if credential == "right" else 401  # a JWT is never the internal token
    if credential == "no_permission" and endpoint.admin:
        return 403
    if credential == "other_user" and endpoint.item:
        return 404
    return 201 if endpoint.method == "POST" else 200


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
async def test_authorization(http: httpx.AsyncClient, me: As, endpoint: Endpoint, credential: str) -> None:
    item = await me.create(f"矩阵 {endpoint} {credential}")
    path = endpoint.path.format(id=item["id"], user=me.user_id)
    response = await http.request(
        endpoint.method, path, headers=headers_for(credential, me.user_id, endpoint), json=endpoint.body
    )
    status = expected(credential, endpoint)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == (0 if status < 300 else status * 100)
    if credential == "other_user" and str(endpoint) == "GET /api/v1/memory":
        assert body["data"]["total"] == 0  # another user sees none of the owner's memories
    # Whatever was refused left the owner's memory as it was.
    if status >= 400:
        mine = (await me.get("/api/v1/memory")).json()["data"]["items"]
        assert [(i["content"], i["status"]) for i in mine] == [(item["content"], "ACTIVE")]
