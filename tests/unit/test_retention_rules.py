"""Which history rows retention folds or removes: pure rules over rows already read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.core.retention import Fold, HistoryRow, OpenRun, expired_memories, fold_touches

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(*spec: tuple[int, str]) -> list[HistoryRow]:
    """(memory_id, action) in order; ids and times count up from 1 and T0."""
    return [
        HistoryRow(i, memory, action, T0 + timedelta(hours=i)) for i, (memory, action) in enumerate(spec, 1)
    ]


def test_a_run_of_touches_folds_into_its_first_row() -> None:
    page = rows((1, "insert"), (1, "touch"), (1, "touch"), (1, "touch"), (1, "update"), (1, "touch"))
    folds, carry = fold_touches(page, None)
    assert folds == [
        Fold(keeper=2, keeper_count=1, count=3, last_at=T0 + timedelta(hours=4), absorbed=(3, 4))
    ]
    # The last touch may continue on the next page, so its run stays open.
    assert carry is not None and carry.keeper.id == 6 and carry.close() is None


def test_any_other_action_or_another_memory_ends_a_run() -> None:
    page = rows(
        (1, "touch"), (1, "demote"), (1, "touch"), (1, "restore"), (1, "touch"), (2, "touch"), (2, "touch")
    )
    folds, carry = fold_touches(page, None)
    assert folds == []  # no run of two touches of one memory is closed on this page
    assert carry is not None and carry.close() == Fold(6, 1, 2, T0 + timedelta(hours=7), (7,))


def test_rows_folded_before_add_their_counts_and_keep_the_latest_time() -> None:
    earlier = HistoryRow(10, 1, "touch", T0, repeat_count=4, last_at=T0 + timedelta(days=3))
    later = HistoryRow(11, 1, "touch", T0 + timedelta(days=1), repeat_count=2, last_at=T0 + timedelta(days=2))
    folds, carry = fold_touches([earlier, later, HistoryRow(12, 1, "edit", T0)], None)
    assert folds == [Fold(10, 4, 6, T0 + timedelta(days=3), (11,))] and carry is None


def test_a_run_carries_across_pages() -> None:
    first, second = rows((1, "touch"), (1, "touch")), rows((1, "touch"), (1, "touch"), (1, "update"))
    second = [HistoryRow(r.id + 2, r.memory_id, r.action, r.created_at) for r in second]
    folds_1, carry = fold_touches(first, None)
    folds_2, carry = fold_touches(second, carry)
    assert folds_1 == [] and carry is None
    assert folds_2 == [Fold(1, 1, 4, T0 + timedelta(hours=2), (2, 3, 4))]


def test_an_open_run_without_followers_folds_nothing() -> None:
    assert OpenRun(1, rows((1, "touch"))[0], 1, T0).close() is None


def test_only_gone_memories_past_the_horizon_are_expired() -> None:
    cutoff = T0
    last_seen = {1: T0 - timedelta(days=1), 2: T0 - timedelta(days=1), 3: T0 + timedelta(days=1), 4: T0}
    assert expired_memories(last_seen, existing=[2], cutoff=cutoff) == [1]


def test_a_touch_by_another_session_or_model_starts_a_new_run() -> None:
    """The history keeps every conversation and model that confirmed a fact; a fold forgets only the
    later event ids of one session's touches and the times between its first and last."""

    def touch(i: int, session: int, model: str) -> HistoryRow:
        return HistoryRow(i, 1, "touch", T0 + timedelta(hours=i), session_id=session, model=model)

    page = [touch(1, 7, "a"), touch(2, 7, "a"), touch(3, 8, "a"), touch(4, 8, "b"), touch(5, 8, "b")]
    folds, carry = fold_touches(page, None)
    assert folds == [Fold(1, 1, 2, T0 + timedelta(hours=2), (2,))]  # session 7, model a
    assert carry is not None and carry.close() == Fold(4, 1, 2, T0 + timedelta(hours=5), (5,))
