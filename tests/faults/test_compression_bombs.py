"""Compression bombs of every codec against a worker held to the pod's memory limit.

Each bomb is a batch of a few KB to a few MB holding one record that inflates to 100 MB. aiokafka
inflated such a batch whole (ten gzip bombs took a worker from 262 to 1,365 MB of RSS); the worker
must stay alive under RLIMIT_DATA = the pod limit, dead-letter each bomb as payload_too_large at its
own offset, and process the good events around them."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path

import httpx
import pytest

from service.adapters.db.database import Database
from service.adapters.kafka.inflate import CODECS
from tests.conftest import event_payload, eventually, said
from tests.e2e.conftest import Topics, read_topic, service_env
from tests.faults.conftest import Report
from tests.support.backends import Broker
from tests.support.pool import items, set_capture
from tests.support.processes import MariaDbDatabase, ServiceProcess
from tests.support.raw_records import raw_batch, send_raw_batch
from tests.support.scripted_llm import ScriptedLlm

MIB = 1024 * 1024
BOMB_BYTES = 100 * MIB
BOMBS_PER_CODEC = 10
GOOD_PER_CODEC = 2
DEPLOYMENT = Path(__file__).resolve().parents[2] / "deploy/k8s/deployment.yaml"


def pod_limit() -> int:
    """The worker container's memory limit in the manifests, in bytes."""
    text = DEPLOYMENT.read_text()
    limits = [int(n) for n in re.findall(r"memory:\s*[\"']?(\d+)Mi", text.split("limits", 1)[1])]
    return limits[0] * MIB


@pytest.mark.timeout(600)
async def test_bombs_of_every_codec_are_dead_lettered_within_the_pod_limit(
    mariadb: MariaDbDatabase,
    broker: Broker,
    llm_server: ScriptedLlm,
    mysql_db: Database,
    user_id: int,
    report: Report,
) -> None:
    limit = pod_limit()
    topics = Topics()
    env = {**service_env(mariadb, broker, llm_server, topics), "MEMORY_KAFKA_PARTITIONS": "1"}
    worker = ServiceProcess("worker", env, name="bombs", memory_limit=limit).start()
    try:
        await set_capture(mysql_db, user_id)
        baseline = worker.peak_rss()
        bomb = b"\x00" * BOMB_BYTES
        bombs: list[int] = []
        markers: list[str] = []
        for codec in CODECS:
            batch = raw_batch([(b"bomb", bomb, [])], compression=codec)
            for n in range(BOMBS_PER_CODEC):
                bombs.append(await send_raw_batch(broker.bootstrap, topics.events, 0, batch))
                if n % (BOMBS_PER_CODEC // GOOD_PER_CODEC) == 0:
                    marker = f"bomb-{CODECS[codec]}-{n}-{uuid.uuid4().hex[:6]}"
                    llm_server.script(marker, [{"type": "user", "content": f"事实 {marker}"}])
                    event = event_payload(user_id, 9_500 + len(markers), lastUserMessage=said(marker))
                    good = raw_batch([(b"good", json.dumps(event).encode(), [])], compression=codec)
                    await send_raw_batch(broker.bootstrap, topics.events, 0, good)
                    markers.append(marker)
        del bomb

        async def extracted() -> float:
            try:  # the worker's loop is busy while it inflates a bomb to drop it
                return await asyncio.to_thread(worker.metric, "mao_memory_events_total", outcome="extracted")
            except httpx.HTTPError:
                return -1

        # The scripted facts are alike, so semantic dedup may fold their rows: the events are counted.
        assert await eventually(extracted, lambda n: n == len(markers), timeout_s=120) == len(markers)
        rows = await items(mysql_db, user_id)
        letters = await eventually(
            lambda: read_topic(broker.bootstrap, topics.dlq), lambda found: len(found) >= len(bombs), 120
        )
        peak = worker.peak_rss()
        assert worker.process is not None and worker.process.poll() is None, "the worker died"
        assert rows and {r.content for r in rows} <= {f"事实 {m}" for m in markers}
        assert sorted(int(dict(r.headers)["x-original-offset"]) for r in letters) == sorted(bombs)
        assert {dict(r.headers)["x-dlq-reason"] for r in letters} == {b"payload_too_large"}
        assert peak < limit
        report.add(
            "compression bombs (100 MB each, every codec) under RLIMIT_DATA = pod limit",
            events=len(bombs) + len(markers),
            faults=len(bombs),
            rows_checked=len(markers) + len(letters),
            losses=0,
            note=(
                f"{BOMBS_PER_CODEC} bombs per codec ({', '.join(CODECS.values())}), each payload_too_large; "
                f"peak RSS {peak / MIB:.0f} MiB (at start {baseline / MIB:.0f} MiB), "
                f"limit {limit / MIB:.0f} MiB"
            ),
        )
        print(
            f"peak RSS {peak / MIB:.1f} MiB, baseline {baseline / MIB:.1f} MiB, limit {limit / MIB:.0f} MiB"
        )
    finally:
        worker.stop()
