"""The capture-switch cache that keeps the skip path free of a round trip per event."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import pytest
import sqlalchemy as sa
from aiokafka import ConsumerRecord

from service.adapters.db import database
from service.adapters.db.database import Database, UnitOfWork
from service.adapters.db.engine import build_engine
from service.adapters.db.errors import is_transient
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.core.outcomes import Outcome
from service.entrypoints.consumer import EventProcessor
from tests.integration.conftest import HandlerFactory, make_event
from tests.support.cancelling import SLOW
from tests.support.pool import set_capture
from tests.support.processes import MariaDbDatabase


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_warm_up_reads_a_batch_of_users_and_no_row_means_off(any_db: Database, user_id: int) -> None:
    on, off, unset = user_id, user_id + 1, user_id + 2
    await set_capture(any_db, on, True)
    await set_capture(any_db, off, False)
    clock = Clock()
    switch = CaptureSwitch(any_db, ttl_s=5, clock=clock)

    await switch.warm([on, off, unset, on])

    assert [switch.cached(u) for u in (on, off, unset)] == [True, False, False]
    await set_capture(any_db, on, False)
    assert switch.cached(on) is True  # served from the cache until the TTL runs out
    clock.now += 5
    assert switch.cached(on) is None
    await switch.warm([on])
    assert switch.cached(on) is False


async def test_a_warm_up_larger_than_one_in_list(any_db: Database, user_id: int) -> None:
    users = list(range(user_id, user_id + 1201))
    for u in users[::3]:
        await set_capture(any_db, u, True)
    switch = CaptureSwitch(any_db, ttl_s=60)

    await switch.warm(users)

    assert [switch.cached(u) for u in users] == [(u - user_id) % 3 == 0 for u in users]


async def test_lookups_take_no_connection_of_the_engines_where_the_driver_pool_serves(
    any_db: Database, user_id: int
) -> None:
    """On MySQL the switch reads on the extraction's lookup pool: a burst of misses would otherwise
    open a second set of connections on the engine (each 256 KiB of buffer with asyncmy)."""
    checkouts: list[object] = []

    def counted(*args: object) -> None:
        checkouts.append(args)

    pools = {any_db.engine.sync_engine.pool, any_db.read_engine.sync_engine.pool}
    for pool in pools:
        sa.event.listen(pool, "checkout", counted)
    try:
        switch = CaptureSwitch(any_db, ttl_s=60)
        await asyncio.gather(switch.enabled(user_id), switch.warm([user_id + 1, user_id + 2]))
    finally:
        for pool in pools:
            sa.event.remove(pool, "checkout", counted)
    assert [switch.cached(u) for u in (user_id, user_id + 1)] == [False, False]
    assert (checkouts == []) == (not any_db.is_sqlite), checkouts


@pytest.mark.parametrize("size", [1, 2, 5, 8, 9])
async def test_every_batch_size_reads_each_user_once_padding_or_not(
    any_db: Database, user_id: int, size: int
) -> None:
    """The IN list is padded to a power of two with the last id: no user is lost or invented."""
    users = list(range(user_id, user_id + size))
    await set_capture(any_db, users[0], True)
    async with any_db.read() as uow:
        found = await uow.accounts.capture_enabled_many(users)
    assert found == {u: u == users[0] for u in users}


class PausedReads:
    """Holds each read open after its rows arrive, so a test can act between the read and the caching."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.read_done = asyncio.Event()
        self.release = asyncio.Event()

    @asynccontextmanager
    async def side_read(self) -> AsyncIterator[UnitOfWork]:
        async with self._db.side_read() as uow:
            yield uow
        self.read_done.set()
        await self.release.wait()


async def test_an_invalidation_during_a_read_keeps_a_stale_answer_out(any_db: Database, user_id: int) -> None:
    paused = PausedReads(any_db)
    switch = CaptureSwitch(cast(Database, paused), ttl_s=60)
    for lookup in (lambda: switch.enabled(user_id), lambda: switch.warm([user_id])):
        await set_capture(any_db, user_id, False)
        paused.read_done.clear()
        paused.release.clear()
        task = asyncio.create_task(lookup())
        await paused.read_done.wait()
        await set_capture(any_db, user_id, True)  # a PATCH lands while the lookup is in flight
        switch.invalidate(user_id)
        paused.release.set()
        await task

        assert switch.cached(user_id) is None
        switch.invalidate(user_id)


class GatedReads:
    """Counts the side lookups and how many run at once; holds the `gated` reads (by number) open
    until `go` is set, and fails the `failing` ones."""

    def __init__(
        self, db: Database, gated: frozenset[int] = frozenset({1}), failing: frozenset[int] = frozenset()
    ):
        self._db = db
        self.gated = gated
        self.failing = failing
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        self.reads = 0
        self.running = 0
        self.most = 0

    @asynccontextmanager
    async def side_read(self) -> AsyncIterator[UnitOfWork]:
        self.reads += 1
        number = self.reads
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if number in self.gated:
                self.started.set()
                await self.go.wait()
            if number in self.failing:
                raise ConnectionResetError(f"lookup {number}'s connection dropped")
            async with self._db.side_read() as uow:
                yield uow
        finally:
            self.running -= 1

    async def next_gate(self) -> None:
        """Lets the held read go and waits until the next gated one holds."""
        self.started.clear()
        self.go.set()
        await self.started.wait()
        self.go.clear()


async def test_misses_while_a_read_runs_are_read_together_by_the_next(any_db: Database, user_id: int) -> None:
    users = list(range(user_id, user_id + 12))
    for u in users[::4]:
        await set_capture(any_db, u, True)
    gated = GatedReads(any_db)
    switch = CaptureSwitch(cast(Database, gated), ttl_s=60)
    first = asyncio.create_task(switch.enabled(users[0]))
    await gated.started.wait()
    rest = [asyncio.create_task(switch.enabled(u)) for u in users[1:6]]
    rest.append(asyncio.create_task(switch.warm(users[6:])))
    await asyncio.sleep(0.05)  # every miss is waiting behind the first read
    gated.go.set()
    answers = [await first, *[await t for t in rest[:-1]]]
    await rest[-1]

    assert answers == [(u - user_id) % 4 == 0 for u in users[:6]]
    assert [switch.cached(u) for u in users] == [(u - user_id) % 4 == 0 for u in users]
    assert (gated.reads, gated.most) == (2, 1)  # eleven misses in one read, never two at once


async def test_a_failed_read_leaves_its_waiters_to_read_for_themselves(
    any_db: Database, user_id: int
) -> None:
    await set_capture(any_db, user_id + 1, True)
    gated = GatedReads(any_db, failing=frozenset({1}))
    switch = CaptureSwitch(cast(Database, gated), ttl_s=60)
    first = asyncio.create_task(switch.enabled(user_id))
    await gated.started.wait()
    waiting = [asyncio.create_task(switch.enabled(u)) for u in (user_id + 1, user_id + 2)]
    await asyncio.sleep(0.05)
    gated.go.set()

    with pytest.raises(ConnectionResetError):
        await first
    assert [await t for t in waiting] == [True, False]
    assert gated.reads == 2  # both waiters in one read
    assert switch.cached(user_id) is None  # the failed caller had its error, nobody reads for it


async def test_the_waiters_of_a_failed_read_share_its_failure(any_db: Database, user_id: int) -> None:
    """An outage costs the users a read took one wait, not one read each after it."""
    gated = GatedReads(any_db, failing=frozenset({2}))
    switch = CaptureSwitch(cast(Database, gated), ttl_s=60)
    first = asyncio.create_task(switch.enabled(user_id))
    await gated.started.wait()
    waiting = [asyncio.create_task(switch.enabled(user_id + i)) for i in (1, 2, 3)]
    await asyncio.sleep(0.05)
    gated.go.set()

    assert await first is False
    for task in waiting:
        with pytest.raises(ConnectionResetError, match="lookup 2"):
            await task
    assert gated.reads == 2
    assert await switch.enabled(user_id + 1) is False  # the next miss reads again
    assert gated.reads == 3


async def test_a_cancelled_read_hands_its_users_to_the_next(any_db: Database, user_id: int) -> None:
    gated = GatedReads(any_db, gated=frozenset({1, 2}))
    switch = CaptureSwitch(cast(Database, gated), ttl_s=60)
    first = asyncio.create_task(switch.enabled(user_id))
    await gated.started.wait()
    reader, *others = [asyncio.create_task(switch.enabled(user_id + i)) for i in (1, 2, 3)]
    await asyncio.sleep(0.05)
    await gated.next_gate()  # the first read done, the second (three users) held
    reader.cancel()  # the task that runs the second read: a warm-up past its timeout
    await asyncio.sleep(0.05)
    gated.go.set()

    assert await first is False
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert [await t for t in others] == [False, False]
    assert gated.reads == 3  # the two left read together


async def test_a_cancelled_lookup_leaves_the_others_answered(any_db: Database, user_id: int) -> None:
    gated = GatedReads(any_db)
    switch = CaptureSwitch(cast(Database, gated), ttl_s=60)
    first = asyncio.create_task(switch.enabled(user_id))
    await gated.started.wait()
    gone = asyncio.create_task(switch.enabled(user_id + 1))
    kept = asyncio.create_task(switch.enabled(user_id + 2))
    await asyncio.sleep(0.05)
    gone.cancel()  # a batch's warm-up past its timeout
    gated.go.set()

    assert (await first, await kept) == (False, False)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert gated.reads == 2


async def test_the_switch_gets_a_connection_while_every_extraction_slot_reads(
    mariadb: MariaDbDatabase, user_id: int
) -> None:
    """The lookup pool keeps a connection beyond `pool_size` for the switch: with every slot's read
    in flight, a miss is answered at once, and the slots' reads never wait for the switch's."""
    db = Database(build_engine(mariadb.url, pool_size=2), build_engine(mariadb.url, 2, autocommit=True))
    try:
        switch = CaptureSwitch(db, ttl_s=60)
        async with contextlib.AsyncExitStack() as held:
            for _ in range(2):
                await held.enter_async_context(db.prepared_read())  # every slot reading
            assert await asyncio.wait_for(switch.enabled(user_id), timeout=2) is False
        async with contextlib.AsyncExitStack() as held:
            await held.enter_async_context(db.side_read())  # the switch's lookup in flight
            async with asyncio.timeout(2):
                units = [await held.enter_async_context(db.prepared_read()) for _ in range(2)]
            assert await units[-1].accounts.capture_enabled_many([user_id]) == {user_id: False}
    finally:
        await db.dispose()


async def test_warm_users_skip_without_io_in_seed_order(
    any_db: Database, make_handler: HandlerFactory, user_id: int
) -> None:
    on, off, unknown = user_id, user_id + 1, user_id + 2
    await set_capture(any_db, on, True)
    handler = make_handler(any_db, capture=CaptureSwitch(any_db, ttl_s=60))
    await handler.warm([on, off])

    assert handler.outcome_without_io(make_event(off)) is Outcome.SKIPPED_CAPTURE_OFF
    # The switch is a trigger condition (seed 5.6): an off user's short message counts as capture-off.
    short = make_event(off, lastUserMessage="好的", lastAssistantMessage=None)
    assert handler.outcome_without_io(short) is Outcome.SKIPPED_CAPTURE_OFF
    assert handler.outcome_without_io(make_event(on, lastUserMessage="好的")) is Outcome.SKIPPED_SHORT
    assert handler.outcome_without_io(make_event(on)) is None  # needs the ledger and the model
    assert handler.outcome_without_io(make_event(unknown)) is None  # needs a lookup
    assert handler.outcome_without_io(make_event(unknown, phase="FAILED")) is Outcome.SKIPPED_PHASE


async def test_a_failed_warm_up_still_hands_over_the_decoded_batch(make_handler: HandlerFactory) -> None:
    unreachable = Database(build_engine("mysql+aiomysql://root@127.0.0.1:1/none", pool_size=1))
    processor = EventProcessor(
        make_handler(unreachable), cast(DeadLetterPublisher, None), Metrics(), after_commit=None
    )
    event = make_event(7)
    good = event.model_dump_json(by_alias=True).encode()
    records = [record(0, good), record(1, b"{not json")]
    try:
        received = await processor.prepare(records)
    finally:
        await unreachable.dispose()

    assert [r.record for r in received] == records
    assert received[0].event == event
    assert getattr(received[1].event, "reason", None) == "invalid_json"
    assert received[0].fast is None  # no switch known: the slow path decides


def record(offset: int, value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 0, offset, 0, 0, b"1", value, None, 0, len(value), ())


async def test_a_side_lookup_hung_on_the_server_ends_in_a_transient_timeout(
    mysql_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The switch's reads run one at a time: one that hangs must not hold up the rest for good."""
    monkeypatch.setattr(database, "SIDE_LOOKUP_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        async with mysql_db.side_read() as uow:
            await uow._statements.rows(SLOW, {"seconds": 3})
    assert time.monotonic() - started < 2
    assert is_transient(caught.value)
    async with mysql_db.side_read() as uow:  # the reserved connection is back
        assert await uow.accounts.capture_enabled_many([1]) == {1: False}
