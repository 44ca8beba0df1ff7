"""A memory's fate told plainly, and the figures it should yield counted one memory at a time: the
oracle the grouped figures (`core.model_quality`, and the SQL behind them) are checked against."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from service.core.model_quality import HORIZONS_DAYS, NO_MODEL, ModelQuality, Rejection

MODELS = ["openai/a", "openai/b", "anthropic/c", None]
# created, reconfirmed, touches, and per horizon: cohort, then rejections in `Rejection` order
Shape = tuple[int, int, int, tuple[tuple[int, ...], ...]]


@dataclass(frozen=True)
class Fate:
    """`age_days`: since the insert; `rejected_after`: days from the insert to the user's first
    rejection (None: never); `touches`: by later extractions."""

    model: str | None
    age_days: float
    rejection: Rejection | None
    rejected_after: float | None
    touches: int


@st.composite
def fates(draw: st.DrawFn, models: Sequence[str | None] = MODELS) -> Fate:
    # Ages and delays keep clear of a horizon's edge by more than SQLite's millisecond.
    age = draw(st.sampled_from([0.5, 3.0, 6.9, 7.1, 12.0, 29.9, 30.1, 45.0, 89.0]))
    rejection = draw(st.none() | st.sampled_from(list(Rejection)))
    delays = [d for d in (0.01, 2.0, 6.9, 7.1, 20.0, 29.9, 30.1, 60.0) if d < age]
    after = draw(st.sampled_from(delays)) if rejection is not None and delays else None
    touches = draw(st.integers(0, 3))
    return Fate(draw(st.sampled_from(models)), age, rejection if after is not None else None, after, touches)


def _horizon(fates: list[Fate], days: int) -> tuple[int, ...]:
    cohort = [f for f in fates if f.age_days >= days]
    rejected = [f.rejection for f in cohort if f.rejected_after is not None and f.rejected_after <= days]
    return (len(cohort), *(rejected.count(kind) for kind in Rejection))


def expected(fates: Iterable[Fate]) -> dict[str, Shape]:
    by_model: dict[str, list[Fate]] = {}
    for fate in fates:
        by_model.setdefault(fate.model or NO_MODEL, []).append(fate)
    return {
        name: (
            len(group),
            sum(f.touches > 0 for f in group),
            sum(f.touches for f in group),
            tuple(_horizon(group, days) for days in HORIZONS_DAYS),
        )
        for name, group in by_model.items()
    }


def shapes(figures: Iterable[ModelQuality]) -> dict[str, Shape]:
    return {
        q.model: (
            q.created,
            q.reconfirmed,
            q.touches,
            tuple((h.cohort, *(h.rejected[kind] for kind in Rejection)) for h in q.horizons),
        )
        for q in figures
    }
