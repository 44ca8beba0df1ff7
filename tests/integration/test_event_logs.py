"""One log line per event outcome, with the event's coordinates; skips summed up on a timer."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from aiokafka import ConsumerRecord
from structlog.testing import capture_logs

from service.adapters.db.database import Database
from service.adapters.kafka.dead_letters import DeadLetterPublisher
from service.adapters.metrics import Metrics
from service.app.caches import CaptureSwitch
from service.core.events import decode_event
from service.core.outcomes import Outcome
from service.entrypoints.consumer import EventProcessor, Received
from tests.conftest import event_payload, said
from tests.integration.conftest import HandlerFactory
from tests.support.dead_letters import RecordingDeadLetters
from tests.support.pool import set_capture
from tests.support.scripted_llm import ScriptedLlm


def received(payload: dict[str, Any] | bytes, offset: int) -> Received:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    record = ConsumerRecord("t", 3, offset, 0, 0, b"key-9", raw, None, 5, len(raw), [])
    return Received(record, decode_event(raw, 1 << 20))


async def test_extractions_dead_letters_and_skips_each_say_what_happened_to_which_event(
    mysql_db: Database,
    make_handler: HandlerFactory,
    llm: ScriptedLlm,
    user_id: int,
) -> None:
    await set_capture(mysql_db, user_id)
    await set_capture(mysql_db, user_id + 1, enabled=False)
    llm.script(f"m{user_id}", [{"type": "user", "content": "报告用中文写"}])
    processor = EventProcessor(
        make_handler(mysql_db, capture=CaptureSwitch(mysql_db, 60)),
        cast(DeadLetterPublisher, RecordingDeadLetters()),
        Metrics(),
        after_commit=None,
    )
    extracted = received(event_payload(user_id, 11, lastUserMessage=said(f"m{user_id}")), 100)
    broken = received(b"{not json", 102)
    [skipped] = await processor.prepare([received(event_payload(user_id + 1, 12), 101).record])

    with capture_logs() as logs:
        timer = asyncio.create_task(processor.skips.every(0.2))
        await processor(extracted)
        assert skipped.fast is Outcome.SKIPPED_CAPTURE_OFF
        processor.taken([skipped])
        await processor(broken)
        await asyncio.sleep(0.3)  # no event after the skip: the timer writes it
        timer.cancel()

    [done] = [e for e in logs if e["event"] == "event_processed"]
    assert done["outcome"] == "extracted" and done["ms"] > 0
    assert (done["event_id"], done["user_id"], done["session_id"], done["partition"], done["offset"]) == (
        extracted.event.event_id,  # type: ignore[union-attr]
        user_id,
        11,
        3,
        100,
    )
    [summary] = [e for e in logs if e["event"] == "events_skipped"]
    assert summary["skipped_capture_off"] == 1 and summary["log_level"] == "info"
    [dead] = [e for e in logs if e["event"] == "event_dead_lettered"]
    assert (dead["reason"], dead["key"], dead["offset"]) == ("invalid_json", "key-9", 102) and dead["error"]


async def test_skips_finished_on_the_fast_path_are_counted_once_their_batch_is_taken(
    mysql_db: Database, make_handler: HandlerFactory, user_id: int
) -> None:
    await set_capture(mysql_db, user_id, enabled=False)
    metrics = Metrics()
    processor = EventProcessor(
        make_handler(mysql_db, capture=CaptureSwitch(mysql_db, 60)),
        cast(DeadLetterPublisher, RecordingDeadLetters()),
        metrics,
    )
    records = [received(event_payload(user_id, 20 + i), 200 + i).record for i in range(3)]
    batch = await processor.prepare(records)

    def skipped() -> float:
        return (
            metrics.registry.get_sample_value("mao_memory_events_total", {"outcome": "skipped_capture_off"})
            or 0.0
        )

    assert all(r.fast is Outcome.SKIPPED_CAPTURE_OFF for r in batch)
    assert skipped() == 0  # decided, not yet finished: the runner may still queue one behind its key
    processor.taken(batch[:2])
    assert skipped() == 2
    processor.taken([])  # nothing new since: counted once
    assert skipped() == 2
