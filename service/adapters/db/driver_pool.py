"""The MySQL driver's own connection pool, for the units of work made of prepared statements only.

SQLAlchemy's async engine pays on every checkout, begin, commit and return: a greenlet each (whose
first frame maps and unmaps a 16 KiB stack chunk), a Connection and its events, a task to close.
On the extraction path that was about a sixth of the handler's CPU per event
(`bench/cpu_profile.py`). Its read round and its locked write run prepared statements only, so they
take connections from the driver's pool instead (asyncmy's or aiomysql's: the same API), opened
with the arguments SQLAlchemy's dialect builds from the URL (FOUND_ROWS among them), the engine's
charset, timeouts and isolation. Errors leave as SQLAlchemy's `DBAPIError` classes, as on every
other path. A connection whose state is in doubt is closed, and none goes back with a transaction
open.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.db import prepared
from service.adapters.db.engine import (
    MYSQL_CONNECT_ARGS,
    POOL_TIMEOUT_S,
    RECYCLE_S,
    WRITE_ISOLATION,
    pool_size_of,
)
from service.adapters.db.prepared import DriverLink, as_sqlalchemy_error


class DriverPool:
    """`pool_size` connections (the extraction's bound, `ExtractionSlots.database`), opened on
    demand and kept. `autocommit`: each statement commits itself (the lookups); else READ COMMITTED
    transactions (the locked writes). Callers queue on the pool's own semaphore, within `timeout_s`,
    not on the driver's pool, which is left no waiter to forget to wake."""

    def __init__(
        self, engine: AsyncEngine, autocommit: bool, timeout_s: float = POOL_TIMEOUT_S, reserved: int = 0
    ) -> None:
        """`reserved`: connections beyond the engine's `pool_size`, for callers outside its bound."""
        self._engine = engine
        self._autocommit = autocommit
        self._timeout_s = timeout_s
        self._size = pool_size_of(engine) + reserved
        self._slots = asyncio.Semaphore(self._size)
        self._pool: Any = None
        self._opening = asyncio.Lock()

    @staticmethod
    def serves(engine: AsyncEngine) -> bool:
        return engine.dialect.name in prepared.DIRECT_DIALECTS

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[DriverLink]:
        """A transaction the block left open is rolled back before the connection goes back, whatever
        the driver reports of it (aiomysql does not see one a SELECT began); a connection that fails
        to roll back is closed."""
        pool, driver = await self._checkout()
        try:
            link = DriverLink(driver, self._engine.dialect, self._autocommit)
            try:
                yield link
            finally:
                if link.in_transaction:
                    with contextlib.suppress(Exception):
                        await link.rollback()
                pool.release(driver)
        finally:
            self._slots.release()

    async def _checkout(self) -> tuple[Any, Any]:
        dialect = self._engine.dialect
        dbapi = dialect.loaded_dbapi
        pool = self._pool
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._slots.acquire()
                try:
                    pool = self._pool or await self._open()
                    return pool, await pool.acquire()
                except BaseException:
                    self._slots.release()
                    raise
        except TimeoutError as exc:
            raise PoolTimeout(f"no database connection within {self._timeout_s} s") from exc
        except dbapi.Error as exc:
            raise as_sqlalchemy_error(dialect, exc) from exc
        except RuntimeError as exc:
            if pool is None or pool is self._pool:
                raise
            raise PoolTimeout("the database pool was closed (the service is stopping)") from exc

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
                    maxsize=self._size,
                    pool_recycle=RECYCLE_S,
                    **{**arguments, **MYSQL_CONNECT_ARGS, **isolation},
                    autocommit=self._autocommit,
                )
        return self._pool

    async def close(self) -> None:
        """Closes every connection, those in use too: called once the work using them has stopped."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
            await pool.wait_closed()


def _isolation() -> str:
    return f"SET SESSION TRANSACTION ISOLATION LEVEL {WRITE_ISOLATION}"
