"""A failed statement's error names the statement, never its values (issue 38): the values are
memory text and conversation ids, and errors reach the logs (`event_retry_transient`,
`event_processing_error`, `http_unhandled_error`)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from service.adapters.db.database import Database
from service.adapters.db.tables import memory_item
from service.core.model import USER_GROUP, Source
from service.core.normalize import dedup_hash

SECRET = "我有高血压,饮食清淡"


async def test_an_error_on_the_prepared_path_carries_no_value(any_db: Database, user_id: int) -> None:
    digest = dedup_hash(USER_GROUP.scope, "", SECRET)
    async with any_db.prepared_locked_user(user_id) as uow:
        await uow.memories.insert(user_id, USER_GROUP, SECRET, digest, Source.AUTO, None, any_db.now())
        with pytest.raises(IntegrityError) as failed:
            await uow.memories.insert(user_id, USER_GROUP, SECRET, digest, Source.AUTO, None, any_db.now())
    assert "memory_item" in str(failed.value) and SECRET not in str(failed.value)


async def test_an_error_through_sqlalchemy_carries_no_value(any_db: Database, user_id: int) -> None:
    row = {
        "user_id": user_id,
        "scope": "USER",
        "project_key": "",
        "content": SECRET,
        "dedup_hash": "x" * 40,
        "created_at": any_db.now(),
        "updated_at": any_db.now(),
    }
    async with any_db.transaction() as uow:
        await uow.conn.execute(sa.insert(memory_item).values(**row))
        with pytest.raises(IntegrityError) as failed:
            await uow.conn.execute(sa.insert(memory_item).values(**row))
    assert "memory_item" in str(failed.value) and SECRET not in str(failed.value)
