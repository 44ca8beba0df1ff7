"""No record makes the running service write a long log line: a dead-lettered record with a 4 MB key
and 1 MB header values leaves every line under 4 KiB, each cut text noting its full length."""

from __future__ import annotations

import json

from aiokafka import AIOKafkaProducer

from tests.conftest import eventually
from tests.e2e.conftest import Topics
from tests.support.processes import ServiceProcess

LINE_BOUND = 4096
KEY = b"k" * (4 * 1024 * 1024)
HEADER = b"h" * (1024 * 1024)


async def test_a_record_with_a_4_mb_key_and_1_mb_headers_logs_only_bounded_lines(
    service: ServiceProcess, producer: AIOKafkaProducer, topics: Topics
) -> None:
    before = service.metric("mao_memory_dead_letters_total")
    written = service.log_path.stat().st_size
    headers = [("trace", HEADER), ("note", HEADER)]
    await producer.send_and_wait(topics.events, b"not json at all", key=KEY, headers=headers)

    async def dead_letters() -> float:
        return service.metric("mao_memory_dead_letters_total")

    assert await eventually(dead_letters, lambda total: total > before, timeout_s=60) > before
    with service.log_path.open("rb") as log:
        log.seek(written)
        lines = log.read().splitlines()
    assert lines and max(len(line) for line in lines) <= LINE_BOUND, max(len(line) for line in lines)
    dead = [json.loads(line) for line in lines if b'"event_dead_lettered"' in line]
    assert dead and dead[-1]["key"].endswith(f"({len(KEY)} bytes)")
