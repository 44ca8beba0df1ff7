"""Each extraction model's quality in production (`core.model_quality`): read on demand for the admin
page, and refreshed into gauges by a timer of the process, never on an event's path.

Every replica computes the same figures from the shared database, so the dashboard takes their
maximum per series; one aggregate query per replica and interval is the whole cost.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from datetime import timedelta

import structlog

from service.adapters.db.database import Database
from service.adapters.db.quality_repository import QualityRepository
from service.adapters.metrics import Metrics
from service.core.model_quality import ModelQuality, summarize

log = structlog.get_logger(__name__)


class ModelQualityReport:
    def __init__(self, db: Database, metrics: Metrics) -> None:
        self._db = db
        self._metrics = metrics

    async def figures(self) -> list[ModelQuality]:
        async with self._db.read() as uow:
            cells = await QualityRepository(uow.conn).cells(self._db.now())
        return summarize(cells)

    async def refresh(self) -> list[ModelQuality]:
        """Reads the figures and replaces the gauges' series with them: a model gone from the
        window leaves no stale series behind."""
        figures = await self.figures()
        self._metrics.publish_model_quality(figures)
        return figures

    async def refresh_forever(self, stop: asyncio.Event, interval: timedelta) -> None:
        """A failed refresh is logged and the gauges keep their last figures until the next one."""
        while not stop.is_set():
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("model_quality_refresh_failed")
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval.total_seconds())
