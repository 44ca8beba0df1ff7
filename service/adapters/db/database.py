"""Connections and the unit of work: a transaction is a visible `async with` block, rolled back
unless committed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.adapters.db.account_repository import AccountRepository
from service.adapters.db.driver_pool import DriverPool
from service.adapters.db.engine import POOL_TIMEOUT_S, SchemaNotCurrent, revision_of
from service.adapters.db.errors import TextRuleChanged
from service.adapters.db.memory_repository import MemoryRepository
from service.adapters.db.prepared import DriverLink, Statements
from service.core.clock import Clock, SystemClock
from service.core.normalize import TEXT_RULE_VERSION

# Lookups `side_read` runs at once, on connections the lookup pool keeps beyond `pool_size`, and
# how long one may take, its wait for the connection included.
SIDE_LOOKUPS = 1
SIDE_LOOKUP_TIMEOUT_S = POOL_TIMEOUT_S


class UnitOfWork:
    """`conn`: a SQLAlchemy connection, or a `DriverLink`, on which only the repositories' prepared
    statements run (`Database.prepared_read`, `Database.prepared_locked_user`)."""

    def __init__(self, conn: AsyncConnection | DriverLink, autocommit: bool = False) -> None:
        self._link = conn
        self._statements = Statements(conn, autocommit)
        self.memories = MemoryRepository(self._statements)
        self.accounts = AccountRepository(self._statements)
        self._committed = False

    @property
    def conn(self) -> AsyncConnection:
        return self._statements.conn

    async def commit(self) -> None:
        await self._link.commit()
        self._committed = True


async def _lock(uow: UnitOfWork, user_id: int) -> None:
    """Takes the user's lock, then makes sure the stored hashes follow this code's text rule: a pod
    of the previous release, still running while a newer one's migration changed the rule, must not
    write hashes the new rule would never find (docs/operations.md, rolling updates)."""
    if not await uow.accounts.lock_user(user_id):
        await uow.accounts.create_user_state(user_id)
    found = await uow.accounts.text_rule()
    if found != TEXT_RULE_VERSION:
        raise TextRuleChanged(found, TEXT_RULE_VERSION)


class Database:
    def __init__(
        self, engine: AsyncEngine, read_engine: AsyncEngine | None = None, clock: Clock | None = None
    ) -> None:
        self.engine = engine
        # Every timestamp the service writes comes from here.
        self.clock: Clock = clock or SystemClock()
        self.read_engine = read_engine or engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        # SQLite has a single writer; serializing writers here turns SQLITE_BUSY into a queue and
        # plays the part of MySQL's per-user row lock in the embedded setup.
        self._sqlite_writer = asyncio.Lock()
        # The prepared-only units of work on MySQL: the driver's own pools (`driver_pool`). The
        # lookup pool holds `pool_size` connections for the extraction's bounded reads, and
        # SIDE_LOOKUPS more for `side_read`, which its semaphore bounds.
        self._lookups = DriverPool(self.read_engine, autocommit=True, reserved=SIDE_LOOKUPS)
        self._side = asyncio.Semaphore(SIDE_LOOKUPS)
        self._writes = DriverPool(engine, autocommit=False)

    def now(self) -> datetime:
        return self.clock.now()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[UnitOfWork]:
        """Lookups on the autocommit read engine; each statement sees the latest committed rows."""
        async with self.read_engine.connect() as conn:
            yield UnitOfWork(conn, autocommit=self.read_engine is not self.engine)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[UnitOfWork]:
        """Rolls back unless `commit()` was called inside the block."""
        async with self._writer(), self.engine.connect() as conn:
            await conn.begin()
            uow = UnitOfWork(conn)
            try:
                yield uow
            finally:
                if not uow._committed and conn.in_transaction():
                    await conn.rollback()

    @asynccontextmanager
    async def locked_user(self, user_id: int) -> AsyncIterator[UnitOfWork]:
        """A transaction holding the user's lock: the 200 cap and the D13/D15 re-checks rely on it.

        The lock row is created only when the lock finds none: an upsert, which takes the same
        exclusive row lock whether it inserts or meets a concurrent first writer's row (READ
        COMMITTED takes no gap lock on the miss, so two first writers queue instead of deadlocking).
        """
        async with self.transaction() as uow:
            await _lock(uow, user_id)
            yield uow

    @asynccontextmanager
    async def prepared_read(self) -> AsyncIterator[UnitOfWork]:
        """`read()` for lookups made of the repositories' prepared statements only, by callers that
        an extraction slot bounds to `pool_size` at once (others use `side_read`)."""
        if not DriverPool.serves(self.read_engine) or self.read_engine is self.engine:
            async with self.read() as uow:
                yield uow
            return
        async with self._lookups.connection() as link:
            yield UnitOfWork(link, autocommit=True)

    @asynccontextmanager
    async def side_read(self) -> AsyncIterator[UnitOfWork]:
        """`prepared_read()` for lookups outside the extraction's slots (the capture switch), one at a
        time on the lookup pool's reserved connection: they neither wait for a slot's read nor make
        one wait for its connection. Bounded in time as a whole: a lookup hung on a stalled server
        ends in a transient TimeoutError rather than holding up the lookups queued behind it."""
        async with self._side, asyncio.timeout(SIDE_LOOKUP_TIMEOUT_S), self.prepared_read() as uow:
            yield uow

    @asynccontextmanager
    async def prepared_locked_user(self, user_id: int) -> AsyncIterator[UnitOfWork]:
        """`locked_user()` for transactions made of the repositories' prepared statements only."""
        if not DriverPool.serves(self.engine):
            async with self.locked_user(user_id) as uow:
                yield uow
            return
        async with self._writes.connection() as link:  # rolls back what is not committed
            uow = UnitOfWork(link)
            await _lock(uow, user_id)
            yield uow

    @asynccontextmanager
    async def _writer(self) -> AsyncIterator[None]:
        if self.is_sqlite:
            async with self._sqlite_writer:
                yield
        else:
            yield

    async def ping(self) -> None:
        async with self.read_engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def require_current_schema(self, wanted: str) -> None:
        """Raises SchemaNotCurrent unless the database is at `wanted` (the code's head revision)."""
        async with self.read_engine.connect() as conn:
            found = await conn.run_sync(revision_of)
        if found != wanted:
            raise SchemaNotCurrent(found, wanted)

    async def dispose(self) -> None:
        await self._lookups.close()
        await self._writes.close()
        await self.engine.dispose()
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()
