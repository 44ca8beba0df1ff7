"""Per-partition commit points under out-of-order completion: never past an unfinished offset."""

from __future__ import annotations

from collections import deque


class PartitionOffsets:
    """Offsets taken from one partition, in fetch order; `commit_point` is the next offset to commit."""

    def __init__(self) -> None:
        self._taken: deque[int] = deque()
        self._done: set[int] = set()
        self.commit_point: int | None = None

    def take(self, offset: int) -> None:
        self._taken.append(offset)

    def pass_over(self, offset: int) -> None:
        """An offset finished as it was taken (a skip decided without I/O): with nothing pending it
        moves the commit point at once, without the bookkeeping of `take` and `finish`."""
        if self._taken:
            self._taken.append(offset)
            self._done.add(offset)
        else:
            self.commit_point = offset + 1

    def finish(self, offset: int) -> None:
        self._done.add(offset)
        while self._taken and self._taken[0] in self._done:
            first = self._taken.popleft()
            self._done.discard(first)
            self.commit_point = first + 1

    @property
    def pending(self) -> int:
        return len(self._taken)
