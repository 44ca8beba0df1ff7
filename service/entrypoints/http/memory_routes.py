"""`/api/v1/memory…`: the signed-in user's own memories; every query is scoped by the caller (D4)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from service.app.memories import MemoryService
from service.core.events import BigintId
from service.core.model import MAX_PROJECT_KEY_CHARS, Scope, Status
from service.core.records import ListFilter
from service.entrypoints.http.api_models import (
    CaptureSetting,
    CreateMemory,
    CreateProjectMemory,
    Deleted,
    HistoryItem,
    MemoryItem,
    MemoryPage,
    PatchMemory,
)
from service.entrypoints.http.auth import Me
from service.entrypoints.http.envelope import Envelope, error_responses, ok

# An id in a path or query takes the event's rule: its canonical decimal digits ("05", "+5", "5.0"
# are 400), as a JSON body would take the integer or that string.
MemoryId = Annotated[BigintId, Path(description="memory id")]


async def page_params(
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=100)] = 20,
    scope: Annotated[Scope | None, Query()] = None,
    project_key: Annotated[str | None, Query(alias="projectKey", max_length=MAX_PROJECT_KEY_CHARS)] = None,
    status: Annotated[Status | None, Query()] = None,
) -> tuple[int, int, ListFilter]:
    return page, page_size, ListFilter(scope=scope, project_key=project_key, status=status)


PageParams = Annotated[tuple[int, int, ListFilter], Depends(page_params)]


def page_data(result: Any) -> dict[str, Any]:
    return {
        "items": [MemoryItem.of(i) for i in result.items],
        "total": result.total,
        "page": result.page,
        "pageSize": result.page_size,
    }


def memory_router(service: MemoryService) -> APIRouter:
    router = APIRouter(
        prefix="/api/v1/memory", tags=["memory"], responses=error_responses(400, 401, 413, 503)
    )

    @router.get("", response_model=Envelope[MemoryPage])
    async def list_memories(me: Me, params: PageParams) -> dict[str, Any]:
        """The caller's memories, newest first (`updated_at` DESC, then `id` DESC)."""
        page, size, where = params
        return ok(page_data(await service.page(me.user_id, where, page, size)))

    @router.post("", status_code=201, response_model=Envelope[MemoryItem], responses=error_responses(409))
    async def create_memory(me: Me, body: CreateMemory) -> dict[str, Any]:
        """Add a MANUAL memory; 409 40900 on duplicate content, 409 40901 at 200 ACTIVE."""
        project_key = body.project_key if isinstance(body, CreateProjectMemory) else None
        item = await service.create(me.user_id, Scope(body.scope), body.content, project_key)
        return ok(MemoryItem.of(item))

    @router.get("/settings", response_model=Envelope[CaptureSetting])
    async def get_settings(me: Me) -> dict[str, Any]:
        """The auto-capture switch; off until the user turns it on (D9)."""
        return ok({"autoCaptureEnabled": await service.capture_enabled(me.user_id)})

    @router.patch("/settings", response_model=Envelope[CaptureSetting])
    async def patch_settings(me: Me, body: CaptureSetting) -> dict[str, Any]:
        """Turn auto-capture on or off."""
        return ok({"autoCaptureEnabled": await service.set_capture(me.user_id, body.auto_capture_enabled)})

    @router.get("/projects", response_model=Envelope[list[str]])
    async def projects(me: Me) -> dict[str, Any]:
        """Project keys seen in the caller's sessions and PROJECT memories, robot channels excluded."""
        return ok(await service.projects(me.user_id))

    @router.get("/{memory_id}", response_model=Envelope[MemoryItem], responses=error_responses(404))
    async def get_memory(me: Me, memory_id: MemoryId) -> dict[str, Any]:
        """One memory of the caller's; 404 for an unknown id and for another user's."""
        return ok(MemoryItem.of(await service.get(me.user_id, memory_id)))

    @router.patch("/{memory_id}", response_model=Envelope[MemoryItem], responses=error_responses(404, 409))
    async def patch_memory(me: Me, memory_id: MemoryId, body: PatchMemory) -> dict[str, Any]:
        """Edit content (re-hashed, status kept: D12) and/or switch ACTIVE ↔ DISMISSED."""
        status = Status(body.status) if body.status else None
        return ok(MemoryItem.of(await service.edit(me.user_id, memory_id, body.content, status)))

    @router.delete("/{memory_id}", response_model=Envelope[Deleted], responses=error_responses(404))
    async def delete_memory(me: Me, memory_id: MemoryId) -> dict[str, Any]:
        """Delete physically (D3); the history stays readable."""
        await service.delete(me.user_id, memory_id)
        return ok({"id": memory_id})

    @router.get(
        "/{memory_id}/history", response_model=Envelope[list[HistoryItem]], responses=error_responses(404)
    )
    async def history(me: Me, memory_id: MemoryId) -> dict[str, Any]:
        """Every change to the memory, oldest first; answers after a delete too."""
        return ok([HistoryItem.of(r) for r in await service.history(me.user_id, memory_id)])

    return router
