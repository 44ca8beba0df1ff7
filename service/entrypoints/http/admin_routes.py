"""`/api/v1/admin/memory…`: read-only governance audit of any user's memories (seed 5.4)."""

from __future__ import annotations

from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Query

from service.app.memories import MemoryService
from service.app.model_quality import ModelQualityReport
from service.app.model_setting import ModelRefused, ModelSetting
from service.core.events import BigintId
from service.entrypoints.http.api_models import (
    ExtractionModelSetting,
    ExtractionModelView,
    ExtractionUsage,
    HistoryItem,
    MemoryPage,
)
from service.entrypoints.http.auth import Admin, Reader
from service.entrypoints.http.envelope import ApiError, Envelope, error_responses, ok
from service.entrypoints.http.memory_routes import MemoryId, PageParams, page_data
from service.entrypoints.http.quality_models import ModelQualityReportView

audit_log = structlog.get_logger("mao_memory.audit")
TargetUser = Annotated[BigintId, Query(alias="userId")]


def admin_router(service: MemoryService, model: ModelSetting, quality: ModelQualityReport) -> APIRouter:
    router = APIRouter(
        prefix="/api/v1/admin/memory", tags=["admin"], responses=error_responses(400, 401, 403, 503)
    )

    @router.get("", response_model=Envelope[MemoryPage])
    async def audit_list(admin: Reader, user_id: TargetUser, params: PageParams) -> dict[str, Any]:
        """A user's memories for audit; needs `memory:read`; every call is logged."""
        page, size, where = params
        audit_log.info("admin_memory_read", caller=admin.user_id, user_id=user_id, page=page)
        return ok(page_data(await service.page(user_id, where, page, size)))

    @router.get(
        "/{memory_id}/history", response_model=Envelope[list[HistoryItem]], responses=error_responses(404)
    )
    async def audit_history(admin: Reader, memory_id: MemoryId, user_id: TargetUser) -> dict[str, Any]:
        """One memory's history for audit; needs `memory:read`; every call is logged."""
        audit_log.info(
            "admin_memory_history_read", caller=admin.user_id, user_id=user_id, memory_id=memory_id
        )
        return ok([HistoryItem.of(r) for r in await service.history(user_id, memory_id)])

    @router.get("/extractions", response_model=Envelope[ExtractionUsage])
    async def audit_extractions(admin: Reader, user_id: TargetUser) -> dict[str, Any]:
        """A user's extractions of the last 24 hours (`MEMORY_EXTRACTIONS_PER_USER_PER_DAY`); needs
        `memory:read`; every call is logged."""
        audit_log.info("admin_extractions_read", caller=admin.user_id, user_id=user_id)
        count = await service.extractions_last_day(user_id)
        return ok({"userId": user_id, "extractionsLast24h": count})

    @router.get("/quality", response_model=Envelope[ModelQualityReportView])
    async def model_quality(admin: Reader) -> dict[str, Any]:
        """Per extraction model, its memories of the last 90 days: how many users dismissed, deleted
        or edited within 7 and 30 days, and how many later extractions re-confirmed; needs
        `memory:read`. No user's memory or text is read, so the call is not audit-logged."""
        return ok(ModelQualityReportView.of(await quality.figures()))

    @router.get("/settings", response_model=Envelope[ExtractionModelView])
    async def get_model_setting(admin: Reader) -> dict[str, Any]:
        """The extraction model (`memory.extractionModelId`, D10), and `rejections`: the events
        dead-lettered as `model_rejected` since it was set (null when none); needs `memory:read`."""
        return ok(ExtractionModelView.of(await model.view()))

    @router.put("/settings", response_model=Envelope[ExtractionModelView], responses=error_responses(413))
    async def put_model_setting(admin: Admin, body: ExtractionModelSetting) -> dict[str, Any]:
        """Choose the extraction model, or "" for the default; needs `memory:admin`; audit-logged.
        A name litellm maps to no provider is refused with 400, and so, with `"probe": true`, is a
        model that fails one tiny test call; the setting is then unchanged."""
        try:
            previous, view = await model.set(body.extraction_model_id, body.probe)
        except ModelRefused as exc:
            raise ApiError(400, str(exc)) from None
        audit_log.info(
            "admin_setting_changed",
            caller=admin.user_id,
            setting="memory.extractionModelId",
            old=previous,
            new=body.extraction_model_id,
            probed=body.probe,
        )
        return ok(ExtractionModelView.of(view))

    return router
