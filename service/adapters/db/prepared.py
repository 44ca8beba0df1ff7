"""The hot path's statements: built with SQLAlchemy Core, compiled once per dialect, and on MySQL run
on the driver's own cursor.

`AsyncConnection.execute` spends about 0.2 ms of CPU per statement on its execution context, result
wrapping and the greenlet hop: more than the driver's whole round trip (`bench/cpu_profile.py`
measures the extraction with and without this path). The few statements that every event and every
injection lookup run take this path; everything else, and every statement on SQLite (the embedded
default), stays on `AsyncConnection.execute`, and each statement keeps one Core definition for
both dialects. Errors leave here as SQLAlchemy raises them: `DBAPIError` subclasses, a disconnect
or an interrupted statement invalidating the connection, so the transient-error rules, the retries
and the pool behave as on the other path.
"""

from __future__ import annotations

import inspect
from collections import namedtuple
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.db.errors import retires_connection

Processor = Callable[[Any], Any] | None
# The dialects whose prepared statements run on the driver's cursor.
DIRECT_DIALECTS = frozenset({"mysql"})
_CURSOR = "mao_memory.driver_cursor"
Statement = sa.Select[Any] | sa.CompoundSelect[Any] | sa.Insert | sa.Update


def _row_type(keys: list[str]) -> Any:
    """Rows read by attribute, like SQLAlchemy's, at the cost of a tuple."""
    return namedtuple("Row", keys, rename=True)


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the parameters in placeholder order
    defaults: tuple[Any, ...]  # values of the statement's literal parameters
    binders: tuple[Processor, ...]
    row: Any  # a namedtuple class for the result's rows; None when the statement returns none
    processors: tuple[Processor, ...]


class Prepared:
    """One Core statement with named parameters. `columns`: an INSERT's columns, which Core needs
    at compile time (it renders only the columns it is given values for). `variants`: the same
    statement written differently for a dialect (a row lock, an upsert, a faster form)."""

    def __init__(
        self,
        statement: Statement,
        columns: Sequence[str] = (),
        variants: Mapping[str, Statement] | None = None,
    ) -> None:
        self._statement = statement
        self._variants = dict(variants or {})
        self._columns = list(columns)
        self._by_dialect: dict[str, _Compiled] = {}

    def statement(self, dialect: str) -> Statement:
        return self._variants.get(dialect, self._statement)

    def compiled(self, dialect: Dialect) -> _Compiled:
        found = self._by_dialect.get(dialect.name)
        if found is None:
            found = self._by_dialect[dialect.name] = self._compile(dialect)
        return found

    def _compile(self, dialect: Dialect) -> _Compiled:
        statement = self.statement(dialect.name)
        compiled = statement.compile(dialect=dialect, column_keys=self._columns or None)
        if not dialect.positional or "POSTCOMPILE" in compiled.string:
            raise ValueError("a prepared statement needs positional parameters and no expanding IN")
        names = tuple(compiled.positiontup or ())
        binds = {name: compiled.binds[name] for name in names}
        row: Any = None
        processors: tuple[Processor, ...] = ()
        if isinstance(statement, sa.SelectBase):
            columns = list(statement.selected_columns)
            row = _row_type([str(c.key) for c in columns])
            processors = tuple(c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns)
        return _Compiled(
            sql=compiled.string,
            names=names,
            defaults=tuple(binds[n].effective_value for n in names),
            binders=tuple(binds[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names),
            row=row,
            processors=processors,
        )

    def arguments(self, compiled: _Compiled, params: Mapping[str, Any]) -> tuple[Any, ...]:
        values = []
        for name, default, bind in zip(compiled.names, compiled.defaults, compiled.binders, strict=True):
            value = params.get(name, default)
            values.append(bind(value) if bind is not None and value is not None else value)
        return tuple(values)


@dataclass(frozen=True, slots=True)
class Written:
    rowcount: int
    lastrowid: int | None


class EngineLink:
    """A SQLAlchemy connection: on MySQL its driver cursor runs the statements. `autocommit`: the
    connection commits every statement itself, so there is no transaction to begin.

    The driver's cursor is kept in the pooled connection's `info`, which SQLAlchemy clears whenever
    it opens a new DBAPI connection, so each connection's cursor is made once, not per checkout.
    """

    def __init__(self, conn: AsyncConnection, autocommit: bool = False) -> None:
        self.conn = conn
        self.dialect = conn.dialect
        self.direct = conn.dialect.name in DIRECT_DIALECTS
        self._autocommit = autocommit
        self._cursor: Any = None

    async def cursor(self) -> Any:
        if not self._autocommit and not self.conn.in_transaction():
            # What SQLAlchemy's autobegin does: without it, its `commit()` would not reach the driver
            # and the statements would stay uncommitted on a connection going back to the pool.
            await self.conn.begin()
        if self._cursor is None:
            self._cursor = self.conn.info.get(_CURSOR)
        if self._cursor is None:
            raw = await self.conn.get_raw_connection()
            self._cursor = await _new_cursor(raw.driver_connection)
            self.conn.info[_CURSOR] = self._cursor
        return self._cursor

    async def retire(self, error: Exception | None) -> None:
        self._cursor = None
        self.conn.info.pop(_CURSOR, None)
        await self.conn.invalidate(error)


class DriverLink:
    """A connection of the driver's own pool (`DriverPool`): prepared statements only."""

    direct = True

    def __init__(self, driver: Any, dialect: Dialect, autocommit: bool = False) -> None:
        self.driver = driver
        self.dialect = dialect
        self.retired = False
        # A statement ran since the last commit or rollback: the driver's own flag misses a
        # transaction that a SELECT began (aiomysql's).
        self.in_transaction = False
        self._autocommit = autocommit
        self._cursor: Any = None

    @property
    def conn(self) -> AsyncConnection:
        raise TypeError("a unit of work on the driver's pool runs prepared statements only")

    async def cursor(self) -> Any:
        if self.retired:
            dbapi = self.dialect.loaded_dbapi
            refused = dbapi.InterfaceError("the connection was retired")
            raise DBAPIError.instance(
                None, None, refused, dbapi.Error, connection_invalidated=True, dialect=self.dialect
            )
        if self._cursor is None:
            self._cursor = await _new_cursor(self.driver)
        self.in_transaction = not self._autocommit
        return self._cursor

    async def retire(self, error: Exception | None) -> None:
        """Closed at once, so the pool drops it when it comes back."""
        self.retired = True
        self._cursor = None
        self.driver.close()

    async def commit(self) -> None:
        await _driver_call(self, self.driver.commit, "COMMIT", ())
        self.in_transaction = False

    async def rollback(self) -> None:
        """Undoes what the block left open; a connection that fails to is closed, never pooled."""
        if self.retired:
            return
        try:
            await _driver_call(self, self.driver.rollback, "ROLLBACK", ())
        except BaseException:
            await self.retire(None)
            raise
        self.in_transaction = False


async def _new_cursor(driver: Any) -> Any:
    cursor = driver.cursor()
    # asyncmy hands the cursor over at once, aiomysql as an awaitable.
    return await cursor if inspect.isawaitable(cursor) else cursor


Link = EngineLink | DriverLink


async def _driver_call(
    link: Link, operation: Callable[[], Awaitable[Any]], sql: str, args: tuple[Any, ...]
) -> Any:
    """Errors leave as SQLAlchemy's `DBAPIError` classes; a disconnect, a session the server
    refuses, or a call interrupted mid-flight retires the connection."""
    dialect = link.dialect
    dbapi = dialect.loaded_dbapi
    try:
        return await operation()
    except Exception as exc:
        # asyncmy reports a connection that is gone as an AttributeError; SQLAlchemy's adapter
        # turns that into this InternalError, which its dialect treats as a disconnect.
        error = (
            dbapi.InternalError("network operation failed due to asyncmy attribute error")
            if isinstance(exc, AttributeError) and dialect.driver == "asyncmy"
            else exc
        )
        if not isinstance(error, dbapi.Error):
            await link.retire(None)  # not the driver's report: where the reply stands is unknown
            raise
        wrapped = as_sqlalchemy_error(dialect, error, sql, args)
        if wrapped.connection_invalidated:
            await link.retire(error)
        raise wrapped from exc
    except BaseException:
        # Cancelled mid-call: the reply may still be on the wire, so the connection must never
        # serve another statement (SQLAlchemy does the same on an exit exception).
        await link.retire(None)
        raise


def as_sqlalchemy_error(
    dialect: Dialect, error: Exception, sql: str | None = None, args: tuple[Any, ...] | None = None
) -> DBAPIError:
    """The driver's error as SQLAlchemy raises it, a disconnect or a refused session marked so."""
    dbapi = dialect.loaded_dbapi
    disconnect = retires_connection(dialect, error)
    # Without the values, as the engines' own errors (`hide_parameters`): they hold memory text.
    wrapped = DBAPIError.instance(
        sql,
        args,
        error,
        dbapi.Error,
        hide_parameters=True,
        connection_invalidated=disconnect,
        dialect=dialect,
    )
    assert isinstance(wrapped, DBAPIError)  # `error` is one of the driver's
    return wrapped


class Statements:
    """Runs `Prepared` statements on one connection: a SQLAlchemy connection (on MySQL through the
    driver's cursor, else through SQLAlchemy), or a `DriverLink`."""

    def __init__(self, conn: AsyncConnection | DriverLink, autocommit: bool = False) -> None:
        self._link: Link = conn if isinstance(conn, DriverLink) else EngineLink(conn, autocommit)

    @property
    def conn(self) -> AsyncConnection:
        """For the statements that are not prepared; a `DriverLink` has none."""
        return self._link.conn

    async def rows(self, prepared: Prepared, params: Mapping[str, Any]) -> list[Any]:
        if not self._link.direct:
            return list(await self.conn.execute(prepared.statement(self.conn.dialect.name), dict(params)))
        compiled = prepared.compiled(self._link.dialect)
        cursor = await self._run(compiled, prepared.arguments(compiled, params))
        fetched = await cursor.fetchall()
        make = compiled.row._make
        if not any(compiled.processors):
            return [make(r) for r in fetched]
        steps = compiled.processors
        return [make(v if p is None else p(v) for p, v in zip(steps, r, strict=True)) for r in fetched]

    async def tuples(self, prepared: Prepared, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        """Rows read by position, as the driver returns them: for reads of many rows, where making
        a named row of each costs more CPU than the driver spends decoding it."""
        if not self._link.direct:
            return list(await self.conn.execute(prepared.statement(self.conn.dialect.name), dict(params)))
        compiled = prepared.compiled(self._link.dialect)
        cursor = await self._run(compiled, prepared.arguments(compiled, params))
        fetched: Sequence[Sequence[Any]] = await cursor.fetchall()
        if not any(compiled.processors):
            return fetched
        steps = compiled.processors
        return [tuple(v if p is None else p(v) for p, v in zip(steps, r, strict=True)) for r in fetched]

    async def write(self, prepared: Prepared, params: Mapping[str, Any]) -> Written:
        if not self._link.direct:
            result = await self.conn.execute(prepared.statement(self.conn.dialect.name), dict(params))
            return Written(result.rowcount, result.lastrowid)
        compiled = prepared.compiled(self._link.dialect)
        cursor = await self._run(compiled, prepared.arguments(compiled, params))
        return Written(cursor.rowcount, cursor.lastrowid)

    async def _run(self, compiled: _Compiled, args: tuple[Any, ...]) -> Any:
        cursor = await self._link.cursor()
        await _driver_call(self._link, lambda: cursor.execute(compiled.sql, args), compiled.sql, args)
        return cursor
