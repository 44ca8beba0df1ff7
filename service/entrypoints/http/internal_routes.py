"""`/internal/v1/memory/…`: what the agent harness puts into the system prompt (seed 5.2), and the
platform's erasure of a user whose account is closed."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Path, Query, Response

from service.app.erasure import UserEraser
from service.app.memories import MemoryService
from service.config import Settings
from service.core.events import BigintId
from service.entrypoints.http.api_models import InjectedMemory, Injection, UserErased
from service.entrypoints.http.auth import internal_caller
from service.entrypoints.http.envelope import Envelope, error_responses, ok


def internal_router(service: MemoryService, settings: Settings, eraser: UserEraser) -> APIRouter:
    router = APIRouter(
        prefix="/internal/v1/memory",
        tags=["internal"],
        dependencies=[Depends(internal_caller)],
        responses=error_responses(400, 401, 503),
    )

    @router.get("/injection", response_model=Envelope[Injection])
    async def injection(
        user_id: Annotated[BigintId, Query(alias="userId")],
        project_key: Annotated[str | None, Query(alias="projectKey", max_length=512)] = None,
    ) -> Response:
        """PROJECT top 12 then USER top 8 (ACTIVE, newest first) and the rendered prompt section."""
        result = await service.injection(user_id, settings.robot_keys.project(project_key))
        # The hot path of every agent turn: the body is built from typed data already, so it skips
        # FastAPI's response-model re-validation (the model still documents it in OpenAPI), and
        # orjson encodes it.
        body = ok({"memories": [InjectedMemory.of(h) for h in result.memories], "prompt": result.prompt})
        return Response(orjson.dumps(body), media_type="application/json")

    @router.delete("/users/{userId}", response_model=Envelope[UserErased])
    async def erase_user(
        user_id: Annotated[BigintId, Path(alias="userId", description="user id")],
    ) -> dict[str, object]:
        """Erase everything the service keeps for the user; answers the rows removed per table.
        Idempotent: a second call answers zeros."""
        return ok({"userId": user_id, "removed": await eraser.erase(user_id)})

    return router
