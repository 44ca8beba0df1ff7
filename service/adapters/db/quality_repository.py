"""The model-quality query: the memories extractions inserted in the window, grouped by model, age
and the user's first rejection (`core.model_quality` holds the rules).

One aggregate over the window's `insert` rows (`idx_history_action_time`); each memory's first
rejection and its touches are looked up through `idx_history_item` (user, memory). It reads actions,
actors, models and times only, so a deleted memory's erased texts change nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.db.dialect import days_between
from service.adapters.db.tables import memory_history
from service.core.model_quality import HORIZONS_DAYS, WINDOW, Cell, Rejection
from service.core.records import HistoryAction, HistoryActor

_born = memory_history.alias("born")
_later = memory_history.alias("later")
_first = memory_history.alias("first_rejection")
_SAME_MEMORY = sa.and_(_later.c.user_id == _born.c.user_id, _later.c.memory_id == _born.c.memory_id)
_REJECTIONS = [r.value for r in Rejection]


def _matured_params(now: datetime) -> dict[str, datetime]:
    return {f"born_by_{d}": now - timedelta(days=d) for d in HORIZONS_DAYS}


def _matured() -> sa.Case[Any]:
    """The longest horizon the insert's age has passed; 0 for none."""
    whens = [(_born.c.created_at <= sa.bindparam(f"born_by_{d}"), d) for d in reversed(HORIZONS_DAYS)]
    return sa.case(*whens, else_=0)


def _within(delay: sa.ColumnElement[float]) -> sa.Case[Any]:
    """The shortest horizon that holds the rejection's delay; NULL for none."""
    return sa.case(*[(delay <= d, d) for d in HORIZONS_DAYS], else_=None)


def _per_memory() -> sa.Subquery:
    first_rejection = (
        sa.select(sa.func.min(_later.c.id))
        .where(
            _SAME_MEMORY,
            _later.c.actor == HistoryActor.USER.value,
            _later.c.action.in_(_REJECTIONS),
        )
        .scalar_subquery()
    )
    touches = (
        sa.select(sa.func.coalesce(sa.func.sum(_later.c.repeat_count), 0))
        .where(
            _SAME_MEMORY,
            _later.c.action == HistoryAction.TOUCH.value,
            _later.c.actor == HistoryActor.AUTO.value,
            _later.c.id > _born.c.id,
        )
        .scalar_subquery()
    )
    memories = (
        sa.select(
            _born.c.model,
            _matured().label("matured"),
            _born.c.created_at.label("born_at"),
            first_rejection.label("first_id"),
            touches.label("touches"),
        )
        .where(
            _born.c.action == HistoryAction.INSERT.value,
            _born.c.actor == HistoryActor.AUTO.value,
            _born.c.created_at >= sa.bindparam("since"),
        )
        .subquery("memories")
    )
    delay = days_between(memories.c.born_at, _first.c.created_at)
    return (
        sa.select(
            memories.c.model,
            memories.c.matured,
            _first.c.action.label("rejection"),
            _within(delay).label("within"),
            memories.c.touches,
        )
        .select_from(memories.outerjoin(_first, _first.c.id == memories.c.first_id))
        .subquery("fates")
    )


_fates = _per_memory()
_CELLS = sa.select(
    _fates.c.model,
    _fates.c.matured,
    _fates.c.rejection,
    _fates.c.within,
    sa.func.count().label("memories"),
    sa.func.sum(sa.case((_fates.c.touches > 0, 1), else_=0)).label("reconfirmed"),
    sa.func.sum(_fates.c.touches).label("touches"),
).group_by(_fates.c.model, _fates.c.matured, _fates.c.rejection, _fates.c.within)


class QualityRepository:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def cells(self, now: datetime) -> list[Cell]:
        """The memories inserted within `WINDOW` before `now`, grouped."""
        rows = await self.conn.execute(_CELLS, {"since": now - WINDOW, **_matured_params(now)})
        return [
            Cell(
                model=r.model,
                matured_days=int(r.matured),
                rejection=Rejection(r.rejection) if r.rejection is not None else None,
                rejected_within=int(r.within) if r.within is not None else None,
                memories=int(r.memories),
                reconfirmed=int(r.reconfirmed or 0),
                touches=int(r.touches or 0),
            )
            for r in rows
        ]
