"""A user erased whole (an account closed): memories, history, capture switch, projects, ledger and
the lock row, in one transaction under the user's lock.

The lock orders the erasure with an extraction of the same user: one that persisted before is
erased with the rest; one that persists after finds capture off (no preference row) and writes
nothing (`ExtractionHandler._persist`).
"""

from __future__ import annotations

import structlog

from service.adapters.db.database import Database
from service.adapters.db.erasure_repository import ErasureRepository
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch

log = structlog.get_logger(__name__)


class UserEraser:
    def __init__(self, db: Database, metrics: Metrics, capture: CaptureSwitch | None = None) -> None:
        self._db = db
        self._metrics = metrics
        self._capture = capture

    async def erase(self, user_id: int) -> dict[str, int]:
        """Rows removed per table; all zeros when nothing of the user was left (idempotent)."""
        async with self._db.transaction() as uow:
            held = await uow.accounts.lock_user(user_id)
            if not held:
                # The lock row is made only to be held, as `locked_user` does: a first writer of the
                # user queues behind it. It is not the user's, so the answer does not count it.
                await uow.accounts.create_user_state(user_id)
            removed = await ErasureRepository(uow.conn).erase(user_id)
            if not held:
                removed["userState"] -= 1
            await uow.commit()
        if self._capture is not None:
            self._capture.invalidate(user_id)
        self._metrics.user_erasures.inc()
        log.info("user_erased", user_id=user_id, **removed)
        return removed
