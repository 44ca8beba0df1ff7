import random

from hypothesis import given
from hypothesis import strategies as st

from service.adapters.kafka.offsets import PartitionOffsets


def test_commit_point_never_passes_an_unfinished_offset() -> None:
    offsets = PartitionOffsets()
    for o in range(10, 15):
        offsets.take(o)
    offsets.finish(12)
    offsets.finish(13)
    assert offsets.commit_point is None
    offsets.finish(10)
    assert offsets.commit_point == 11
    offsets.finish(11)
    assert offsets.commit_point == 14
    offsets.finish(14)
    assert offsets.commit_point == 15 and offsets.pending == 0


def test_gaps_in_offsets_are_fine() -> None:
    offsets = PartitionOffsets()
    for o in (3, 7, 9):
        offsets.take(o)
    offsets.finish(7)
    offsets.finish(3)
    assert offsets.commit_point == 8


def test_a_skip_with_nothing_pending_moves_the_commit_point_at_once() -> None:
    offsets = PartitionOffsets()
    offsets.pass_over(4)
    assert offsets.commit_point == 5 and offsets.pending == 0


def test_a_skip_behind_an_unfinished_offset_waits_for_it() -> None:
    offsets = PartitionOffsets()
    offsets.pass_over(4)
    offsets.take(5)
    offsets.pass_over(6)
    offsets.pass_over(7)
    assert offsets.commit_point == 5
    offsets.finish(5)
    assert offsets.commit_point == 8 and offsets.pending == 0


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=60), st.randoms())
def test_the_commit_point_never_passes_an_unfinished_offset_and_ends_past_the_last(
    plan: list[tuple[bool, int]], rnd: random.Random
) -> None:
    """Offsets in fetch order, each skipped at once or taken and finished later in any order."""
    offsets = PartitionOffsets()
    unfinished: list[int] = []
    offset = 0
    for skipped, gap in plan:
        offset += 1 + gap
        if skipped:
            offsets.pass_over(offset)
        else:
            offsets.take(offset)
            unfinished.append(offset)
        if unfinished and rnd.random() < 0.3:
            offsets.finish(unfinished.pop(rnd.randrange(len(unfinished))))
        if unfinished and offsets.commit_point is not None:
            assert offsets.commit_point <= min(unfinished)
    for left in rnd.sample(unfinished, len(unfinished)):
        offsets.finish(left)
    assert offsets.commit_point == offset + 1 and offsets.pending == 0
