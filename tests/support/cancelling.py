"""A prepared statement cancelled while the server is still answering it."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from service.adapters.db.prepared import Prepared, Statements

SLOW = Prepared(sa.select(sa.func.sleep(sa.bindparam("seconds")).label("slept")))


async def cancel_mid_statement(statements: Statements) -> None:
    """Starts a three-second statement and cancels it after 0.3 s, its reply still to come."""
    task = asyncio.create_task(statements.rows(SLOW, {"seconds": 3}))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
