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
