"""The answer of `GET /api/v1/admin/memory/quality`: per extraction model (`core.model_quality`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from service.core.model_quality import WINDOW, HorizonFigures, ModelQuality, Rejection
from service.entrypoints.http.api_models import CamelModel


class RejectedCounts(CamelModel):
    """By the user's first rejecting action on each memory."""

    dismissed: int
    deleted: int
    edited: int
    total: int


class HorizonView(CamelModel):
    days: int
    cohort: int = Field(description="the model's memories at least `days` old")
    rejected: RejectedCounts = Field(description="of the cohort, rejected within `days` of creation")
    rejected_rate: float | None = Field(description="rejected.total / cohort; null while the cohort is empty")

    @classmethod
    def of(cls, h: HorizonFigures) -> dict[str, Any]:
        counts = {kind.label: h.rejected[kind] for kind in Rejection}
        return {
            "days": h.days,
            "cohort": h.cohort,
            "rejected": counts | {"total": h.rejected_total},
            "rejectedRate": _rounded(h.rejected_rate),
        }


class ModelQualityView(CamelModel):
    model: str = Field(description='the model on the insert; "(other)" sums the models past the tenth')
    created: int = Field(description="memories its extractions inserted in the window")
    reconfirmed: int = Field(description="of those, touched at least once by a later extraction")
    reconfirmed_rate: float | None
    touches: int = Field(description="touches of those memories by later extractions")
    within: list[HorizonView]

    @classmethod
    def of(cls, q: ModelQuality) -> dict[str, Any]:
        return {
            "model": q.model,
            "created": q.created,
            "reconfirmed": q.reconfirmed,
            "reconfirmedRate": _rounded(q.reconfirmed_rate),
            "touches": q.touches,
            "within": [HorizonView.of(h) for h in q.horizons],
        }


class ModelQualityReportView(CamelModel):
    window_days: int = Field(description="memories inserted in this many days before now are counted")
    models: list[ModelQualityView] = Field(description="most memories first")

    @classmethod
    def of(cls, figures: list[ModelQuality]) -> dict[str, Any]:
        return {"windowDays": WINDOW.days, "models": [ModelQualityView.of(q) for q in figures]}


def _rounded(rate: float | None) -> float | None:
    return round(rate, 4) if rate is not None else None
