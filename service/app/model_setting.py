"""The extraction model setting (`memory.extractionModelId`, D10): read with what the model has been
doing, and set only once litellm can route the name (and, when asked, once the model answered a
test call), so that a typo is refused at the door rather than found in the dead-letter topic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog

from service.adapters.db.database import Database
from service.app.ports import LlmError, ModelCheck
from service.core.model_rejections import Rejections, shown

log = structlog.get_logger(__name__)

# A probe's deadline: the configured call timeout, at most this (an admin is waiting for the answer).
MAX_PROBE_S = 10.0


class ModelRefused(Exception):
    """The model is not set; the message says why, for the admin."""


@dataclass(frozen=True, slots=True)
class ModelSettingView:
    configured: str  # "" means the default
    effective: str
    rejections: Rejections | None  # events dead-lettered as `model_rejected` since it was set


class ModelSetting:
    def __init__(self, db: Database, check: ModelCheck, default_model: str, timeout_s: float) -> None:
        self._db = db
        self._check = check
        self._default = default_model
        self._probe_s = min(timeout_s, MAX_PROBE_S)

    async def view(self) -> ModelSettingView:
        async with self._db.read() as uow:
            configured = await uow.accounts.extraction_model()
            tally = await uow.accounts.model_rejections()
        effective = configured or self._default
        return ModelSettingView(configured, effective, shown(tally, effective))

    async def set(self, value: str, probe: bool) -> tuple[str, ModelSettingView]:
        """The previous value and the new view; ModelRefused when the effective model (the default
        for "") cannot be routed, or fails the probe. Read by the next extraction: the handler looks
        the setting up for every event."""
        model = value or self._default
        # The first check of a process imports litellm (seconds): off the event loop.
        problem = await asyncio.to_thread(self._check.provider_problem, model)
        if problem is not None:
            raise ModelRefused(f"{problem}; name it provider/model, e.g. openai/gpt-4o-mini")
        if probe:
            await self._probe(model)
        async with self._db.transaction() as uow:
            previous = await uow.accounts.extraction_model()
            await uow.accounts.set_extraction_model(value, self._db.now())
            await uow.commit()
        return previous, ModelSettingView(value, model, None)

    async def _probe(self, model: str) -> None:
        try:
            await self._check.probe(model, self._probe_s)
        except LlmError as exc:
            log.info("model_probe_failed", model=model, kind=exc.kind, status=exc.status)
            raise ModelRefused(f"{model!r} failed a test call ({exc.kind}): {exc.detail[:200]}") from exc
