"""Keeps storage bounded: expired ledger rows, folded touch runs, the history of long-gone memories.

Work is done in small transactions (a batch of ledger keys, one page of one user's history, one
chunk of one user's purge); only a purge takes the per-user lock, to decide afresh which trails are
still those of long-gone memories, so extraction and the HTTP API never wait behind it for longer
than one such transaction. The periodic run claims its slot in
`memory_system_setting`, so replicas and restarts run it once per interval between them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

import structlog

from service.adapters.db.database import Database
from service.adapters.db.retention_repository import RetentionRepository
from service.adapters.metrics import Metrics
from service.core.labels import RetentionKind, RetentionResult
from service.core.retention import OpenRun, expired_memories, fold_touches

log = structlog.get_logger(__name__)

LEDGER_BATCH = 1000
HISTORY_PAGE = 2000
USERS_PER_SCAN = 200
PURGE_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Horizons:
    ledger: timedelta
    deleted_history: timedelta


@dataclass
class RetentionReport:
    ledger_deleted: int = 0
    touches_folded: int = 0
    history_purged: int = 0
    users_scanned: int = 0
    transactions: int = 0
    longest_transaction_ms: float = 0.0
    duration_s: float = 0.0
    rows_before: dict[str, int] = field(default_factory=dict)
    rows_after: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def line(self) -> str:
        return (
            f"{self.ledger_deleted} ledger rows deleted, {self.touches_folded} touches folded, "
            f"{self.history_purged} history rows purged, {self.users_scanned} users scanned, "
            f"{self.transactions} transactions"
        )


class RetentionJob:
    def __init__(self, db: Database, metrics: Metrics, horizons: Horizons) -> None:
        self._db = db
        self._metrics = metrics
        self._horizons = horizons
        self._progress: Callable[[RetentionReport], None] = _no_progress

    async def run_once(self, progress: Callable[[RetentionReport], None] | None = None) -> RetentionReport:
        """`progress` is called after each of the run's write transactions (the command's progress lines)."""
        report = RetentionReport()
        self._progress = progress or _no_progress
        started = time.perf_counter()
        now = self._db.now()
        try:
            report.rows_before = await self._row_counts()
            await self._expire_ledger(now - self._horizons.ledger, report)
            await self._compact_history(now - self._horizons.deleted_history, report)
            report.rows_after = await self._row_counts()
        except Exception:
            self._metrics.retention_runs.labels(RetentionResult.ERROR).inc()
            raise
        report.duration_s = time.perf_counter() - started
        self._metrics.retention_runs.labels(RetentionResult.OK).inc()
        self._metrics.retention_duration.set(report.duration_s)
        self._metrics.retention_longest_transaction.set(report.longest_transaction_ms / 1000)
        log.info("retention_finished", **report.as_dict())
        return report

    async def run_forever(self, stop: asyncio.Event, interval: timedelta) -> None:
        """Claims a run every `interval` across replicas; a failed run is logged and tried next time."""
        await _sleep_unless_stopped(stop, random.uniform(60, 300))
        while not stop.is_set():
            try:
                if await self._claim(interval):
                    await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention_failed")
            await _sleep_unless_stopped(stop, min(interval.total_seconds(), 3600) * random.uniform(0.9, 1.1))

    async def _claim(self, interval: timedelta) -> bool:
        async with self._db.transaction() as uow:
            claimed = await uow.accounts.claim_periodic("retention.lastRunAt", self._db.now(), interval)
            await uow.commit()
        return claimed

    @asynccontextmanager
    async def _timed(
        self, report: RetentionReport, user_id: int | None = None
    ) -> AsyncIterator[RetentionRepository]:
        """One short write transaction, holding `user_id`'s lock if given; its time (from taking the
        connection, or SQLite's writer lock, to the commit) is what others might have waited for."""
        begin = self._db.transaction() if user_id is None else self._db.locked_user(user_id)
        async with begin as uow:
            started = time.perf_counter()
            yield RetentionRepository(uow.conn)
            await uow.commit()
        report.transactions += 1
        report.longest_transaction_ms = max(
            report.longest_transaction_ms, (time.perf_counter() - started) * 1000
        )

    async def _row_counts(self) -> dict[str, int]:
        async with self._db.read() as uow:
            counts = await RetentionRepository(uow.conn).row_counts()
        for table, count in counts.items():
            self._metrics.table_rows.labels(table).set(count)
        return counts

    async def _expire_ledger(self, cutoff: datetime, report: RetentionReport) -> None:
        while True:
            async with self._timed(report) as repo:
                keys = await repo.expired_ledger_keys(cutoff, LEDGER_BATCH)
                deleted = await repo.delete_ledger(keys) if keys else 0
            report.ledger_deleted += deleted
            self._progress(report)
            self._metrics.retention_removed.labels(RetentionKind.LEDGER_EXPIRED).inc(deleted)
            if len(keys) < LEDGER_BATCH:
                return

    async def _compact_history(self, cutoff: datetime, report: RetentionReport) -> None:
        after_user = -1
        while True:
            async with self._db.read() as uow:
                users = await RetentionRepository(uow.conn).users_after(after_user, USERS_PER_SCAN)
            for user_id in users:
                await self._compact_user(user_id, cutoff, report)
                report.users_scanned += 1
            if len(users) < USERS_PER_SCAN:
                return
            after_user = users[-1]

    async def _compact_user(self, user_id: int, cutoff: datetime, report: RetentionReport) -> None:
        last_seen: dict[int, datetime] = {}
        carry: OpenRun | None = None
        after = (-1, -1)
        while True:
            async with self._db.read() as uow:
                page = await RetentionRepository(uow.conn).history_page(user_id, after, HISTORY_PAGE)
            for row in page:
                last_seen[row.memory_id] = max(last_seen.get(row.memory_id, row.latest), row.latest)
            final = len(page) < HISTORY_PAGE
            folds, carry = fold_touches(page, carry)
            if final and carry is not None and (fold := carry.close()) is not None:
                folds.append(fold)
            if folds:
                async with self._timed(report) as repo:
                    folded = sum([await repo.apply_fold(f) for f in folds])
                report.touches_folded += folded
                self._progress(report)
                self._metrics.retention_removed.labels(RetentionKind.TOUCHES_FOLDED).inc(folded)
            if final:
                break
            after = (page[-1].memory_id, page[-1].id)
        async with self._db.read() as uow:
            existing = await RetentionRepository(uow.conn).memory_ids(user_id)
        gone = expired_memories(last_seen, existing, cutoff)
        for start in range(0, len(gone), PURGE_CHUNK):
            # Decided again under the user's lock: a memory deleted since the reads above has a new
            # `delete` row, and its trail stays.
            async with self._timed(report, user_id) as repo:
                purged = await repo.purge_expired(user_id, gone[start : start + PURGE_CHUNK], cutoff)
            report.history_purged += purged
            self._progress(report)
            self._metrics.retention_removed.labels(RetentionKind.DELETED_MEMORY_HISTORY).inc(purged)


def _no_progress(_: RetentionReport) -> None:
    pass


async def _sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
