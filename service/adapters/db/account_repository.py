"""Per-user bookkeeping around the memories: the capture switch, projects, ledger, lock row, settings."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from functools import cache

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.db.dialect import insert_ignore, upsert, upsert_statement
from service.adapters.db.prepared import Prepared, Statements
from service.adapters.db.tables import (
    EXTRACTION_MODEL_SETTING,
    MODEL_REJECTIONS_SETTING,
    TEXT_RULE_SETTING,
    memory_event_ledger,
    memory_system_setting,
    memory_user_project,
    memory_user_state,
    user_memory_preference,
)
from service.core.model_rejections import Rejections, counted, decode, encode
from service.core.outcomes import Outcome

# Bound parameters per IN list: well inside SQLite's and MySQL's limits.
IN_LIST_CHUNK = 512
# The statements every extraction runs, compiled once (`prepared`).
_LEDGER_COLUMNS = ("event_id", "user_id", "session_id", "outcome", "processed_at")
_INSERT_LEDGER = Prepared(memory_event_ledger.insert(), _LEDGER_COLUMNS)
# The ledger row, inserted only while the user's capture is on: the switch read in the write itself.
_LEDGER_VALUES = [sa.bindparam(c, type_=memory_event_ledger.c[c].type) for c in _LEDGER_COLUMNS]
_INSERT_LEDGER_WHILE_CAPTURING = Prepared(
    memory_event_ledger.insert().from_select(
        list(_LEDGER_COLUMNS),
        sa.select(*_LEDGER_VALUES).where(
            user_memory_preference.c.user_id == _LEDGER_VALUES[1],
            user_memory_preference.c.auto_capture_enabled == sa.true(),
        ),
    )
)
_USER_STATE = sa.select(memory_user_state.c.user_id).where(
    memory_user_state.c.user_id == sa.bindparam("user_id")
)
# A row lock in MySQL; SQLite has one writer at a time, which `Database` enforces instead.
_LOCK_USER = Prepared(_USER_STATE, variants={"mysql": _USER_STATE.with_for_update()})
_SETTING = memory_system_setting.c
_RULE = sa.select(_SETTING.value).where(_SETTING.setting_key == TEXT_RULE_SETTING)
# A shared lock in MySQL: writers hold it together, and a migration changing the rule (which updates
# the row first) waits for them, then makes the next ones wait until it has re-hashed and committed.
_TEXT_RULE = Prepared(_RULE, variants={"mysql": _RULE.with_for_update(read=True)})
# The lock row inserted, or the existing one locked by a no-op update of its key (its mark kept).
_STATE_ROW = {
    "user_id": sa.bindparam("new_user"),
    "consolidation_due_at": sa.null(),
    "removal_mark": sa.bindparam("mark", type_=sa.BigInteger),
}
_CREATE_USER_STATE = Prepared(
    upsert_statement("sqlite", memory_user_state, _STATE_ROW, ["user_id"]),
    variants={"mysql": upsert_statement("mysql", memory_user_state, _STATE_ROW, ["user_id"])},
)


def removal_mark() -> int:
    """A lock row's removal mark: random, so that a row made again after an erasure never repeats
    the mark of the erased one, nor a delete the mark before it; never 0, the mark the migration
    gave rows made before."""
    return 1 + secrets.randbits(62)


@cache
def _capture_of(users: int) -> Prepared:
    """The switch of `users` users. Lists are padded to a power of two, so a handful of statements
    serve every batch size, each compiled once."""
    t = user_memory_preference
    wanted: list[sa.BindParameter[int]] = [sa.bindparam(f"user{i}") for i in range(users)]
    return Prepared(sa.select(t.c.user_id, t.c.auto_capture_enabled).where(t.c.user_id.in_(wanted)))


class AccountRepository:
    def __init__(self, statements: Statements) -> None:
        self._statements = statements

    @property
    def conn(self) -> AsyncConnection:
        return self._statements.conn

    async def capture_enabled(self, user_id: int) -> bool:
        """D9: no preference row means off."""
        value = await self.conn.scalar(
            sa.select(user_memory_preference.c.auto_capture_enabled).where(
                user_memory_preference.c.user_id == user_id
            )
        )
        return bool(value)

    async def capture_enabled_many(self, user_ids: Collection[int]) -> dict[int, bool]:
        """The switch of every user in one round trip; users without a row are off (D9)."""
        found: dict[int, bool] = dict.fromkeys(user_ids, False)
        ids = sorted(found)
        for start in range(0, len(ids), IN_LIST_CHUNK):
            chunk = ids[start : start + IN_LIST_CHUNK]
            size = 1 << (len(chunk) - 1).bit_length()
            params = {f"user{i}": chunk[min(i, len(chunk) - 1)] for i in range(size)}
            rows = await self._statements.rows(_capture_of(size), params)
            found.update((user_id, bool(enabled)) for user_id, enabled in rows)
        return found

    async def set_capture(self, user_id: int, enabled: bool, now: datetime) -> None:
        await upsert(
            self.conn,
            user_memory_preference,
            {"user_id": user_id, "auto_capture_enabled": enabled, "created_at": now, "updated_at": now},
            ["auto_capture_enabled", "updated_at"],
        )

    async def remember_project(self, user_id: int, project_key: str, now: datetime) -> None:
        await insert_ignore(
            self.conn,
            memory_user_project,
            {"user_id": user_id, "project_key": project_key, "first_seen_at": now},
        )

    async def seen_projects(self, user_id: int) -> list[str]:
        rows = await self.conn.execute(
            sa.select(memory_user_project.c.project_key).where(memory_user_project.c.user_id == user_id)
        )
        return [r.project_key for r in rows]

    async def processed_and_model(self, event_id: str) -> tuple[bool, str]:
        """Whether the ledger holds the event, and the configured extraction model, in one round trip."""
        ledger, setting = memory_event_ledger, memory_system_setting
        row = (
            await self.conn.execute(
                sa.select(
                    sa.exists().where(ledger.c.event_id == event_id).label("processed"),
                    sa.select(setting.c.value)
                    .where(setting.c.setting_key == EXTRACTION_MODEL_SETTING)
                    .scalar_subquery()
                    .label("model"),
                )
            )
        ).one()
        return bool(row.processed), (row.model or "").strip()

    async def extractions_since(self, user_id: int, since: datetime) -> int:
        """The user's extractions (ledger rows: events the model answered) since `since`."""
        ledger = memory_event_ledger
        count = await self.conn.scalar(
            sa.select(sa.func.count())
            .select_from(ledger)
            .where(ledger.c.user_id == user_id, ledger.c.processed_at >= since)
        )
        return int(count or 0)

    async def mark_processed(
        self, event_id: str, user_id: int, session_id: int, outcome: str, now: datetime
    ) -> bool:
        """False when the event id is already in the ledger: the caller must roll back its effects.

        No savepoint: both dialects undo only the failed statement, and the caller then rolls back
        the whole transaction anyway, so a savepoint would cost two round trips for nothing.
        """
        try:
            await self._statements.write(
                _INSERT_LEDGER,
                {
                    "event_id": event_id,
                    "user_id": user_id,
                    "session_id": session_id,
                    "outcome": outcome,
                    "processed_at": now,
                },
            )
        except IntegrityError:
            return False
        return True

    async def mark_processed_while_capturing(
        self, event_id: str, user_id: int, session_id: int, outcome: str, now: datetime
    ) -> Outcome | None:
        """`mark_processed`, in the same one statement only while the user's capture is on. None once
        the ledger holds the event; else the skip, nothing written: SKIPPED_DUPLICATE_EVENT, or
        SKIPPED_CAPTURE_OFF when the switch went off (the user, or an erasure, which deletes it)
        after the event's first read of it."""
        params = dict(zip(_LEDGER_COLUMNS, (event_id, user_id, session_id, outcome, now), strict=True))
        try:
            written = await self._statements.write(_INSERT_LEDGER_WHILE_CAPTURING, params)
        except IntegrityError:
            return Outcome.SKIPPED_DUPLICATE_EVENT
        return None if written.rowcount == 1 else Outcome.SKIPPED_CAPTURE_OFF

    async def claim_periodic(self, key: str, now: datetime, interval: timedelta) -> bool:
        """True for the one caller that finds the job `key` not run for `interval`; it is then due
        again `interval` from now (the row is the claim, across replicas and restarts)."""
        await insert_ignore(
            self.conn, memory_system_setting, {"setting_key": key, "value": "", "updated_at": now}
        )
        t = memory_system_setting
        claimed = await self.conn.execute(
            sa.update(t)
            .where(t.c.setting_key == key, sa.or_(t.c.value == "", t.c.updated_at <= now - interval))
            .values(value="claimed", updated_at=now)
        )
        return int(claimed.rowcount) == 1

    async def create_user_state(self, user_id: int) -> None:
        """Insert the lock row, or lock the one a concurrent first writer just inserted."""
        await self._statements.write(_CREATE_USER_STATE, {"new_user": user_id, "mark": removal_mark()})

    async def words_removed(self, user_id: int) -> None:
        """A new removal mark on the user's lock row (held by the caller): their words were deleted."""
        t = memory_user_state
        await self.conn.execute(t.update().where(t.c.user_id == user_id).values(removal_mark=removal_mark()))

    async def lock_user(self, user_id: int) -> bool:
        """Hold the user's row lock until the transaction ends; False when the row does not exist."""
        found = await self._statements.rows(_LOCK_USER, {"user_id": user_id})
        return bool(found)

    async def text_rule(self) -> str | None:
        """The text rule's version the database's hashes follow, held (MySQL) until the transaction
        ends; None before the migration that records it."""
        rows = await self._statements.rows(_TEXT_RULE, {})
        return str(rows[0][0]) if rows else None

    async def consolidation_due(self, user_id: int) -> datetime | None:
        """When consolidation may run next for the user; None: whenever its conditions hold."""
        value: datetime | None = await self.conn.scalar(
            sa.select(memory_user_state.c.consolidation_due_at).where(memory_user_state.c.user_id == user_id)
        )
        return value

    async def set_consolidation_due(self, user_id: int, when: datetime) -> None:
        await self.conn.execute(
            memory_user_state.update()
            .where(memory_user_state.c.user_id == user_id)
            .values(consolidation_due_at=when)
        )

    async def extraction_model(self) -> str:
        value = await self.conn.scalar(
            sa.select(memory_system_setting.c.value).where(
                memory_system_setting.c.setting_key == EXTRACTION_MODEL_SETTING
            )
        )
        return (value or "").strip()

    async def set_extraction_model(self, value: str, now: datetime) -> None:
        """The rejections of the model before are no longer news: their tally goes."""
        await upsert(
            self.conn,
            memory_system_setting,
            {"setting_key": EXTRACTION_MODEL_SETTING, "value": value, "updated_at": now},
            ["value", "updated_at"],
        )
        await self.conn.execute(
            sa.delete(memory_system_setting).where(
                memory_system_setting.c.setting_key == MODEL_REJECTIONS_SETTING
            )
        )

    async def model_rejections(self) -> Rejections | None:
        value = await self.conn.scalar(
            sa.select(memory_system_setting.c.value).where(
                memory_system_setting.c.setting_key == MODEL_REJECTIONS_SETTING
            )
        )
        return decode(value)

    async def count_model_rejection(
        self, model: str, kind: str, error: str, now: datetime, private: Sequence[str] = ()
    ) -> Rejections:
        """One more event dead-lettered as `model_rejected`, the error kept without a quote of the
        `private` texts (`counted`); the row is locked while it is counted, so replicas counting at
        once add up (SQLite has one writer at a time)."""
        t = memory_system_setting
        await insert_ignore(
            self.conn, t, {"setting_key": MODEL_REJECTIONS_SETTING, "value": "", "updated_at": now}
        )
        where = t.c.setting_key == MODEL_REJECTIONS_SETTING
        before = await self.conn.scalar(sa.select(t.c.value).where(where).with_for_update())
        tally = counted(decode(before), model, kind, error, now, private)
        await self.conn.execute(sa.update(t).where(where).values(value=encode(tally), updated_at=now))
        return tally
