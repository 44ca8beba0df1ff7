"""The MySQL driver's own connection pool, for the units of work made of prepared statements only.

SQLAlchemy's async engine pays on every checkout, begin, commit and return: a greenlet each (whose
first frame maps and unmaps a 16 KiB stack chunk), a Connection and its events, a task to close.
On the extraction path that was about a sixth of the handler's CPU per event
(`bench/cpu_profile.py`). Its read round and its locked write run prepared statements only, so they
take connections from the driver's pool instead (asyncmy's or aiomysql's: the same API), opened
with the arguments SQLAlchemy's dialect builds from the URL (FOUND_ROWS among them), the engine's
charset, timeouts and isolation. Errors leave as SQLAlchemy's `DBAPIError` classes, as on every
other path. A connection whose state is in doubt is closed; the driver's pool also closes, rather
than keeps, a connection returned with a transaction open.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.db.engine import MYSQL_CONNECT_ARGS, POOL_TIMEOUT_S, RECYCLE_S, WRITE_ISOLATION
from service.adapters.db.errors import retires_connection
from service.adapters.db.prepared import DIRECT_DIALECTS, DriverLink


class DriverPool:
    """As many connections as the engine's pool, opened on demand and kept. `autocommit`: each
    statement commits itself (the lookups); else READ COMMITTED transactions (the locked writes)."""

    def __init__(self, engine: AsyncEngine, autocommit: bool, timeout_s: float = POOL_TIMEOUT_S) -> None:
        self._engine = engine
        self._autocommit = autocommit
        self._timeout_s = timeout_s
        self._pool: Any = None
        self._opening = asyncio.Lock()

    @staticmethod
    def serves(engine: AsyncEngine) -> bool:
        return engine.dialect.name in DIRECT_DIALECTS

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[DriverLink]:
        pool = self._pool or await self._open()
        link = DriverLink(await self._acquire(pool), self._engine.dialect)
        try:
            yield link
        finally:
            pool.release(link.driver)

    async def _acquire(self, pool: Any) -> Any:
        dialect = self._engine.dialect
        dbapi = dialect.loaded_dbapi
        try:
            async with asyncio.timeout(self._timeout_s):
                return await pool.acquire()
        except TimeoutError as exc:
            raise PoolTimeout(f"no database connection within {self._timeout_s} s") from exc
        except dbapi.Error as exc:
            disconnect = retires_connection(dialect, exc)
            raise DBAPIError.instance(
                None, None, exc, dbapi.Error, connection_invalidated=disconnect, dialect=dialect
            ) from exc

    async def _open(self) -> Any:
        async with self._opening:
            if self._pool is None:
                engine = self._engine
                # The dialect learns the server (its version, quoting, upsert syntax) on SQLAlchemy's
                # first connection, and the prepared statements are compiled by it.
                async with engine.connect():
                    pass
                _, arguments = engine.dialect.create_connect_args(engine.url)
                isolation = {} if self._autocommit else {"init_command": _isolation()}
                driver = importlib.import_module(engine.dialect.driver)
                self._pool = await driver.create_pool(
                    minsize=0,
                    maxsize=engine.pool.size(),  # type: ignore[attr-defined]
                    pool_recycle=RECYCLE_S,
                    **{**arguments, **MYSQL_CONNECT_ARGS, **isolation},
                    autocommit=self._autocommit,
                )
        return self._pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
            await pool.wait_closed()


def _isolation() -> str:
    return f"SET SESSION TRANSACTION ISOLATION LEVEL {WRITE_ISOLATION}"
