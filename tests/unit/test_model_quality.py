"""The per-model quality figures from grouped memories: every memory counted once, in the cohorts its
age has reached, by the user's first rejection; the model label bounded."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from service.core.model_quality import HORIZONS_DAYS, OTHER_MODELS, Cell, Rejection, summarize
from tests.support.quality import Fate, expected, fates, shapes


def _horizon_of(days: float, *, passed: bool) -> int | None:
    """As the query groups: the longest horizon an age passed, or the shortest one a delay fits in."""
    if passed:
        return max((h for h in HORIZONS_DAYS if days >= h), default=0)
    return min((h for h in HORIZONS_DAYS if days <= h), default=None)


def cells_of(memories: list[Fate]) -> list[Cell]:
    """One cell per memory: the grouping the database does, before it sums alike cells."""
    return [
        Cell(
            f.model,
            _horizon_of(f.age_days, passed=True) or 0,
            f.rejection,
            _horizon_of(f.rejected_after, passed=False) if f.rejected_after is not None else None,
            1,
            int(f.touches > 0),
            f.touches,
        )
        for f in memories
    ]


@given(st.lists(fates(), max_size=40))
def test_the_figures_are_the_memories_counted_one_by_one(memories: list[Fate]) -> None:
    assert shapes(summarize(cells_of(memories))) == expected(memories)


@given(st.lists(fates(), max_size=40))
def test_a_horizon_never_counts_more_rejections_than_its_cohort_nor_a_cohort_more_than_created(
    memories: list[Fate],
) -> None:
    for q in summarize(cells_of(memories)):
        cohorts = [h.cohort for h in q.horizons]
        assert cohorts == sorted(cohorts, reverse=True) and cohorts[0] <= q.created
        for h in q.horizons:
            assert h.rejected_total <= h.cohort
            assert h.rejected_rate is None if h.cohort == 0 else 0 <= h.rejected_rate <= 1
        assert q.reconfirmed <= q.created


@given(st.lists(fates(models=[f"m{i}" for i in range(15)]), max_size=60), st.integers(1, 5))
def test_models_past_the_cap_are_summed_as_other_and_nothing_is_lost(memories: list[Fate], cap: int) -> None:
    figures = summarize(cells_of(memories), max_models=cap)
    named = [q for q in figures if q.model != OTHER_MODELS]
    assert len(named) <= cap and len(figures) <= cap + 1
    assert sum(q.created for q in figures) == len(memories)
    assert sum(q.touches for q in figures) == sum(f.touches for f in memories)
    created = Counter(f.model for f in memories)
    # The names kept are those with the most memories.
    if OTHER_MODELS in {q.model for q in figures}:
        least_kept = min(created[q.model] for q in named)
        assert all(created[m] <= least_kept for m in created if m not in {q.model for q in named})


def test_a_young_memory_is_left_out_of_the_horizons_it_has_not_reached() -> None:
    """A model in use for three days, whose users dismissed half its memories, shows no rate yet,
    rather than a low one."""
    young = [Fate("new", 3.0, Rejection.DISMISSED, 1.0, 0), Fate("new", 3.0, None, None, 2)]
    (q,) = summarize(cells_of(young))
    assert (q.created, q.reconfirmed, q.touches) == (2, 1, 2)
    assert [(h.cohort, h.rejected_rate) for h in q.horizons] == [(0, None), (0, None)]


def test_a_rejection_after_the_horizon_counts_in_the_longer_one_only() -> None:
    old = [Fate("m", 40.0, Rejection.EDITED, 10.0, 0), Fate("m", 40.0, Rejection.DELETED, 2.0, 0)]
    (q,) = summarize(cells_of(old))
    seven, thirty = q.horizons
    assert (seven.cohort, seven.rejected[Rejection.DELETED], seven.rejected[Rejection.EDITED]) == (2, 1, 0)
    assert (thirty.cohort, thirty.rejected_total, thirty.rejected_rate) == (2, 2, 1.0)
    assert [k.label for k in Rejection] == ["dismissed", "deleted", "edited"]
