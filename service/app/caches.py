"""Short-lived caches that keep the skip path free of a database round trip per event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from service.adapters.db.database import Database

MAX_ENTRIES = 100_000


class CaptureSwitch:
    """The auto-capture flag per user, cached for `ttl_s`.

    A PATCH through this process invalidates its entry at once; another process's PATCH takes
    effect within the TTL, which is the staleness the platform accepts for an opt-in switch.
    """

    def __init__(self, db: Database, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[int, tuple[bool, float]] = {}
        # Bumped by every invalidation: a read that started before one must not cache what it read.
        self._generation = 0
        # The reads, one at a time: the users asked for meanwhile, the count begun, and the last
        # read's number, users and answer (or failure).
        self._turn = asyncio.Lock()
        self._wanted: set[int] = set()
        self._reads = 0
        self._last: tuple[int, set[int], dict[int, bool] | Exception] = (0, set(), {})

    async def enabled(self, user_id: int) -> bool:
        cached = self.cached(user_id)
        if cached is not None:
            return cached
        return (await self._read({user_id}))[user_id]

    async def warm(self, user_ids: Iterable[int]) -> None:
        """Fetch every user without a fresh entry in one round trip, so their events can skip at once."""
        missing = {u for u in user_ids if self.cached(u) is None}
        if missing:
            await self._read(missing)

    def cached(self, user_id: int) -> bool | None:
        """The switch if a fresh entry is at hand, without I/O; None when a lookup is needed."""
        entry = self._entries.get(user_id)
        if entry is not None and entry[1] > self._clock():
            return entry[0]
        return None

    def invalidate(self, user_id: int) -> None:
        self._generation += 1
        self._entries.pop(user_id, None)

    async def _read(self, user_ids: set[int]) -> dict[int, bool]:
        """One read at a time, on the database's side lookup: the users asked for while one runs are
        read together by the next, and a read that began after a caller asked answers it, or fails
        it, so an outage costs its waiters one wait, not one each. A cancelled read hands its users
        to the next. Cached unless an invalidation arrived while the read ran."""
        self._wanted |= user_ids
        asked = self._reads
        async with self._turn:
            number, batch, outcome = self._last
            if number <= asked or not user_ids <= batch:
                batch, self._wanted = self._wanted | user_ids, set()
                self._reads += 1
                number, generation = self._reads, self._generation
                try:
                    async with self._db.side_read() as uow:
                        outcome = await uow.accounts.capture_enabled_many(batch)
                except Exception as exc:
                    outcome = exc
                except BaseException:
                    self._wanted |= batch - user_ids
                    raise
                self._last = (number, batch, outcome)
                if not isinstance(outcome, Exception) and generation == self._generation:
                    self._remember(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        return {u: outcome[u] for u in user_ids}

    def _remember(self, values: dict[int, bool]) -> None:
        if len(self._entries) + len(values) > MAX_ENTRIES:
            self._entries.clear()
        expires = self._clock() + self._ttl_s
        for user_id, value in values.items():
            self._entries[user_id] = (value, expires)


class ProjectRecorder:
    """Records each (user, projectKey) once per process; the insert itself is idempotent."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._seen: set[tuple[int, str]] = set()

    def known(self, user_id: int, project_key: str) -> bool:
        return (user_id, project_key) in self._seen

    async def remember(self, user_id: int, project_key: str) -> None:
        key = (user_id, project_key)
        if key in self._seen:
            return
        async with self._db.transaction() as uow:
            await uow.accounts.remember_project(user_id, project_key, self._db.now())
            await uow.commit()
        if len(self._seen) >= MAX_ENTRIES:
            self._seen.clear()
        self._seen.add(key)
