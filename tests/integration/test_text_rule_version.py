"""A pod of the previous release writes no memory once a newer release's migration changed the text rule.

Each test owns a database at this code's head; "the newer release's migration" is what such a
revision does first: it updates `memory.textRuleVersion` (and later moves `alembic_version`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine

from service.adapters.db.database import Database
from service.adapters.db.engine import SCHEMA_HEAD, SchemaNotCurrent, build_engine, sync_url
from service.adapters.db.errors import TextRuleChanged, is_transient
from service.adapters.db.tables import TEXT_RULE_SETTING
from service.adapters.metrics import Metrics
from service.core.model import Group, Scope, Source
from service.core.normalize import TEXT_RULE_VERSION, dedup_hash
from service.entrypoints.consumer import EventProcessor
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.integration.test_model_failure_budget import received, record
from tests.support.dead_letters import RecordingDeadLetters
from tests.support.old_pools import database_at
from tests.support.pool import ledger, set_capture
from tests.support.scripted_llm import ScriptedLlm

USER = 41
NEWER = str(int(TEXT_RULE_VERSION) + 1)
SET_RULE = sa.text("UPDATE memory_system_setting SET value = :v WHERE setting_key = :k")


@pytest.fixture(params=["mysql", "sqlite"])
async def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Database, str]]:
    with database_at(request.param, "head", tmp_path) as url:
        db = Database(build_engine(url, pool_size=2))
        try:
            yield db, url
        finally:
            await db.dispose()


def newer_rule(url: str, version: str | None) -> None:
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            if version is None:
                forget = sa.text("DELETE FROM memory_system_setting WHERE setting_key = :k")
                conn.execute(forget, {"k": TEXT_RULE_SETTING})
            else:
                conn.execute(SET_RULE, {"v": version, "k": TEXT_RULE_SETTING})
    finally:
        engine.dispose()


async def write_one(db: Database, content: str) -> None:
    async with db.locked_user(USER) as uow:
        digest = dedup_hash(Scope.USER, "", content)
        await uow.memories.insert(USER, Group(Scope.USER), content, digest, Source.MANUAL, None, db.now())
        await uow.commit()


async def count(db: Database) -> int:
    async with db.read() as uow:
        found = await uow.conn.scalar(
            sa.text("SELECT COUNT(*) FROM memory_item WHERE user_id = :u"), {"u": USER}
        )
        return int(found or 0)


async def test_the_migrations_record_the_codes_text_rule(fresh: tuple[Database, str]) -> None:
    db, _ = fresh
    async with db.read() as uow:
        assert await uow.accounts.text_rule() == TEXT_RULE_VERSION
    await write_one(db, "用 pnpm 管理依赖")
    assert await count(db) == 1


@pytest.mark.parametrize("version", [NEWER, None], ids=["newer", "unrecorded"])
async def test_a_write_under_another_rule_is_refused_as_transient(
    fresh: tuple[Database, str], version: str | None
) -> None:
    db, url = fresh
    newer_rule(url, version)
    with pytest.raises(TextRuleChanged, match=f"this code writes version {TEXT_RULE_VERSION}") as caught:
        await write_one(db, "用 pnpm 管理依赖")
    assert is_transient(caught.value)  # the consumer holds the offset, the API answers 503
    assert await count(db) == 0
    with pytest.raises(TextRuleChanged):  # the hot path's lock checks it too
        async with db.prepared_locked_user(USER):
            pass


async def test_readiness_fails_once_the_newer_release_moved_the_schema(fresh: tuple[Database, str]) -> None:
    db, url = fresh
    newer_rule(url, NEWER)
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        engine.dispose()
    with pytest.raises(SchemaNotCurrent, match=f"schema revision 9999; this code needs {SCHEMA_HEAD}"):
        await db.require_current_schema(SCHEMA_HEAD)


async def test_a_writer_waits_for_the_rule_changing_migration_then_refuses(tmp_path: Path) -> None:
    """MariaDB: the migration updates the rule's row first and holds it until it commits; a writer
    that takes its user's lock meanwhile waits, then sees the new rule and writes nothing."""
    with database_at("mysql", "head", tmp_path) as url:
        db = Database(build_engine(url, pool_size=2))
        engine = create_engine(sync_url(url))
        try:
            with engine.connect() as migration:
                migration.execute(SET_RULE, {"v": NEWER, "k": TEXT_RULE_SETTING})
                writer = asyncio.create_task(write_one(db, "用 pnpm 管理依赖"))
                await asyncio.sleep(0.5)
                assert not writer.done()  # held by the migration's row lock
                migration.commit()
            with pytest.raises(TextRuleChanged):
                await asyncio.wait_for(writer, 10)
            assert await count(db) == 0
        finally:
            engine.dispose()
            await db.dispose()


async def test_events_wait_out_a_newer_rule_with_the_models_answer_kept(
    fresh: tuple[Database, str], make_handler: HandlerFactory, llm: ScriptedLlm, metrics: Metrics
) -> None:
    """The old pod's events: answered by the model once, never written under the old rule, never
    dead-lettered; they finish if the rule is this code's again (here: by hand), else on new pods."""
    db, url = fresh
    await set_capture(db, USER)
    marker = f"rule{uuid.uuid4().hex[:8]}"
    llm.script(marker, [{"type": "user", "content": "滚动升级期间不写旧规则的哈希"}])
    events = [event_payload(USER, n, lastUserMessage=said(marker)) for n in range(1, 4)]
    newer_rule(url, NEWER)
    handle = EventProcessor(make_handler(db), RecordingDeadLetters(), metrics)  # type: ignore[arg-type]
    tasks = [asyncio.create_task(handle(received(record(e, n)))) for n, e in enumerate(events)]
    await asyncio.sleep(2)
    assert not any(task.done() for task in tasks)
    assert await count(db) == 0
    newer_rule(url, TEXT_RULE_VERSION)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    assert len(llm.calls(marker)) == len(events)
    assert await count(db) == 1
    assert all([await ledger(db, e["eventId"]) for e in events])
