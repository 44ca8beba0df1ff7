"""One extraction write per user at a time in this process, waited for before a database slot.

The write takes the user's row lock (`memory_user_state`, `SELECT … FOR UPDATE`) on a connection
from a bounded pool. Were the slot taken first, a user whose row is locked elsewhere (a DBA's
query, a hung replica's connection) would pile all of their events onto the slots while they wait
for the row, up to `innodb_lock_wait_timeout`, and every other user would wait behind them. Taken
first, this turn lets such a user hold one slot at most; their other events wait here, holding
nothing another user needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class UserTurns:
    def __init__(self) -> None:
        # Per user with a write waiting or under way: its lock and how many hold or wait for it.
        self._turns: dict[int, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def turn(self, user_id: int) -> AsyncIterator[None]:
        lock, holders = self._turns.get(user_id) or (asyncio.Lock(), 0)
        self._turns[user_id] = (lock, holders + 1)
        try:
            async with lock:
                yield
        finally:
            lock, holders = self._turns[user_id]
            if holders == 1:
                del self._turns[user_id]
            else:
                self._turns[user_id] = (lock, holders - 1)

    def __len__(self) -> int:
        """Users with a write waiting or under way (kept only while they have one)."""
        return len(self._turns)
