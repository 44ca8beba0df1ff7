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
from collections.abc import Callable, Mapping, Sequence
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


class Statements:
    """Runs `Prepared` statements on one connection: on MySQL through the driver, else through
    SQLAlchemy. `autocommit`: the connection commits every statement itself, so there is no
    transaction to begin.

    The driver's cursor is kept in the pooled connection's `info`, which SQLAlchemy clears whenever
    it opens a new DBAPI connection, so each connection's cursor is made once, not per checkout.
    """

    def __init__(self, conn: AsyncConnection, autocommit: bool = False) -> None:
        self.conn = conn
        self._autocommit = autocommit
        self._direct = conn.dialect.name in DIRECT_DIALECTS
        self._cursor: Any = None

    async def rows(self, prepared: Prepared, params: Mapping[str, Any]) -> list[Any]:
        if not self._direct:
            return list(await self.conn.execute(prepared.statement(self.conn.dialect.name), dict(params)))
        compiled = prepared.compiled(self.conn.dialect)
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
        if not self._direct:
            return list(await self.conn.execute(prepared.statement(self.conn.dialect.name), dict(params)))
        compiled = prepared.compiled(self.conn.dialect)
        cursor = await self._run(compiled, prepared.arguments(compiled, params))
        fetched: Sequence[Sequence[Any]] = await cursor.fetchall()
        if not any(compiled.processors):
            return fetched
        steps = compiled.processors
        return [tuple(v if p is None else p(v) for p, v in zip(steps, r, strict=True)) for r in fetched]

    async def write(self, prepared: Prepared, params: Mapping[str, Any]) -> Written:
        if not self._direct:
            result = await self.conn.execute(prepared.statement(self.conn.dialect.name), dict(params))
            return Written(result.rowcount, result.lastrowid)
        compiled = prepared.compiled(self.conn.dialect)
        cursor = await self._run(compiled, prepared.arguments(compiled, params))
        return Written(cursor.rowcount, cursor.lastrowid)

    async def _run(self, compiled: _Compiled, args: tuple[Any, ...]) -> Any:
        if not self._autocommit and not self.conn.in_transaction():
            # What SQLAlchemy's autobegin does: without it, its `commit()` would not reach the driver
            # and the statements would stay uncommitted on a connection going back to the pool.
            await self.conn.begin()
        if self._cursor is None:
            self._cursor = self.conn.info.get(_CURSOR)
        if self._cursor is None:
            raw = await self.conn.get_raw_connection()
            cursor = raw.driver_connection.cursor()  # type: ignore[union-attr]
            # asyncmy hands the cursor over at once, aiomysql as an awaitable.
            self._cursor = await cursor if inspect.isawaitable(cursor) else cursor
            self.conn.info[_CURSOR] = self._cursor
        dbapi = self.conn.dialect.loaded_dbapi
        try:
            await self._cursor.execute(compiled.sql, args)
        except Exception as exc:
            # asyncmy reports a connection that is gone as an AttributeError; SQLAlchemy's adapter
            # turns that into this InternalError, which its dialect treats as a disconnect.
            error = (
                dbapi.InternalError("network operation failed due to asyncmy attribute error")
                if isinstance(exc, AttributeError) and self.conn.dialect.driver == "asyncmy"
                else exc
            )
            if not isinstance(error, dbapi.Error):
                raise
            disconnect = retires_connection(self.conn.dialect, error)
            if disconnect:
                await self._invalidate(error)
            raise DBAPIError.instance(
                compiled.sql,
                args,
                error,
                dbapi.Error,
                connection_invalidated=disconnect,
                dialect=self.conn.dialect,
            ) from exc
        except BaseException:
            # Cancelled mid-statement: the reply may still be on the wire, so the connection must
            # never serve another statement (SQLAlchemy does the same on an exit exception).
            await self._invalidate(None)
            raise
        return self._cursor

    async def _invalidate(self, error: Exception | None) -> None:
        self._cursor = None
        self.conn.info.pop(_CURSOR, None)
        await self.conn.invalidate(error)
