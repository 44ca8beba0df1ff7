"""`make bench`: every case measured side by side in one run, on one broker and one database.

Writes bench/results.json (all figures) and bench/RESULTS.md (the table docs/performance.md quotes).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiomysql
import httpx
import pymysql
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench import cpu_profile as cpu_profile_module
from service.adapters.kafka.topics import ensure_topics
from service.core.model import Scope
from service.core.normalize import dedup_hash
from tests.support.backends import mysql_server
from tests.support.processes import MariaDbDatabase, ServiceProcess, TansuBroker
from tests.support.scripted_llm import ScriptedLlm

HERE = Path(__file__).resolve().parent
# A name in litellm's cost map, as a production model is: an unknown name costs litellm extra lookups.
MODEL = "openai/gpt-4o-mini"
RAW_WINDOW = (
    "SELECT id, scope, project_key, content FROM memory_item WHERE user_id=%s AND scope=%s "
    "AND project_key=%s AND status='ACTIVE' ORDER BY updated_at DESC, id DESC LIMIT %s"
)
SKIP_EVENTS = int(os.environ.get("BENCH_SKIP_EVENTS", "1000000"))
SKIP_PASSES = 2
SESSIONS = int(os.environ.get("BENCH_SESSIONS", "1000"))
LLM_LATENCY_S = 0.2
# Progress is read from the group's committed offsets on the broker (the worker commits every
# 0.5 s); /metrics is scraped no more often than a real Prometheus would.
PROGRESS_POLL_S = 0.25
WARM_UP_EVENTS = 200  # the first events pay one-off lazy imports and connection set-up
INJECT_USERS = int(os.environ.get("BENCH_INJECT_USERS", "10000"))
INJECT_PER_USER = 50
INJECT_CLIENTS, INJECT_REQUESTS = 50, 20_000  # seconds of load, not a one-second burst
PARTITIONS = 12
STEADY_EVENTS = int(os.environ.get("BENCH_STEADY_EVENTS", "1000"))
# The worker's memory target: what `import litellm` alone takes, plus this much for the service.
RSS_ALLOWANCE_MIB = 64
INTERNAL_TOKEN = "bench-internal-token-bench-internal-token"  # noqa: S105 - 32 bytes, as the service requires


def case(
    figure: float, reference: float, ratio: float, target: str, met: bool, **details: Any
) -> dict[str, Any]:
    """One case in results.json: the figure, what it is compared with, the ratio and the target."""
    return {
        "figure": figure,
        "reference": reference,
        "ratio": round(ratio, 3),
        "target": target,
        "met": met,
        **details,
    }


class Bench:
    def __init__(self) -> None:
        self.broker = TansuBroker().start()
        self.llm = ScriptedLlm(record=False).start()
        self.db = MariaDbDatabase().create()
        self.results: dict[str, Any] = {
            "machine": {
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def close(self) -> None:
        self.db.drop()
        self.llm.stop()
        self.broker.stop()

    def env(self, topic: str, group: str, in_flight: int) -> dict[str, str]:
        return {
            "MEMORY_DATABASE_URL": self.db.url,
            "MEMORY_KAFKA_BOOTSTRAP": self.broker.bootstrap,
            "MEMORY_KAFKA_TOPIC": topic,
            "MEMORY_KAFKA_DLQ_IDEMPOTENCE": "false",  # Tansu has no idempotent producers
            "MEMORY_KAFKA_GROUP_ID": group,
            "MEMORY_KAFKA_PARTITIONS": str(PARTITIONS),
            "MEMORY_LLM_API_BASE": self.llm.api_base,
            "MEMORY_LLM_API_KEY": "bench",
            "MEMORY_DEFAULT_MODEL": MODEL,
            "MEMORY_MAX_IN_FLIGHT": str(in_flight),
            "MEMORY_LOG_LEVEL": "WARNING",
            "MEMORY_JWT_SECRET": "bench-secret-bench-secret-bench-secret-0123",
            "MEMORY_INTERNAL_TOKEN": INTERNAL_TOKEN,
            "MEMORY_DATABASE_POOL_SIZE": "10",
            "MEMORY_RETENTION_INTERVAL_HOURS": "0",
        }

    async def publish(self, topic: str, events: list[dict[str, Any]]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.broker.bootstrap, linger_ms=5)
        await producer.start()
        try:
            for start in range(0, len(events), 2000):
                chunk = events[start : start + 2000]
                futures = [
                    await producer.send(topic, json.dumps(e).encode(), key=str(e["sessionId"]).encode())
                    for e in chunk
                ]
                await asyncio.gather(*futures)
        finally:
            await producer.stop()

    # -- case 1 ------------------------------------------------------------------------------------
    async def skip_path(self) -> dict[str, Any]:
        topic = f"bench-skip-{uuid.uuid4().hex[:6]}"
        await ensure_topics(self.broker.bootstrap, [topic, f"{topic}.dlq"], PARTITIONS)
        events = [event(9_000_000 + i % 500, 1_000_000 + i, i) for i in range(SKIP_EVENTS)]  # capture off
        await self.publish(topic, events)
        # Passes over the same topic, the bare loop and the service taking turns; the best of each
        # counts. A single pass of either moved by up to 40% between runs on this shared machine
        # (the broker, MariaDB and the client share its two cores), more than what is compared.
        bare_passes, service_passes = [], []
        for _ in range(SKIP_PASSES):
            bare_passes.append(await bare_consume(self.broker.bootstrap, topic, SKIP_EVENTS))
            service_passes.append(await self.service_rate(topic, SKIP_EVENTS, workers=1, in_flight=64))
        bare = max(bare_passes)
        service = max(service_passes, key=lambda p: p["events_per_s"])
        ratio = service["events_per_s"] / bare
        return case(
            round(service["events_per_s"]),
            round(bare),
            ratio,
            "≥ 0.8",
            ratio >= 0.8,
            events=SKIP_EVENTS,
            unit="events/s, service vs bare aiokafka consume-and-decode, best of each pass",
            worker_cpu_ms_per_event=service["worker_cpu_ms_per_event"],
            bare_passes=[round(b) for b in bare_passes],
            service_passes=[p["events_per_s"] for p in service_passes],
        )

    # -- cases 3, 4, 5 -----------------------------------------------------------------------------
    async def extraction(self, workers: int, in_flight: int, sessions: int) -> dict[str, Any]:
        topic = f"bench-llm-{workers}-{in_flight}-{uuid.uuid4().hex[:6]}"
        await ensure_topics(self.broker.bootstrap, [topic, f"{topic}.dlq"], PARTITIONS)
        base_user = random.randint(10**9, 2 * 10**9)
        users = [base_user + s for s in range(sessions)]
        with pymysql.connect(
            host=mysql_server().host, port=mysql_server().port, user="root", database=self.db.name
        ) as conn:
            conn.cursor().executemany(
                "INSERT INTO user_memory_preference VALUES (%s, 1, NOW(6), NOW(6))", [(u,) for u in users]
            )
            conn.commit()
        self.llm.reset()
        self.llm.default_delay_s = LLM_LATENCY_S
        self.llm.script("bench-llm", [{"type": "user", "content": "基准测试里的长期偏好"}])
        events = [
            event(users[s], 2_000_000 + s, seq, f"bench-llm {s}/{seq}")
            for seq in (0, 1)
            for s in range(sessions)
        ]
        result = await self.service_rate(topic, len(events), workers, in_flight, publish=events)
        ideal = workers * in_flight / LLM_LATENCY_S
        result.update(
            {
                "in_flight": in_flight,
                "sessions": sessions,
                "events": len(events),
                "ideal_events_per_s": ideal,
                "ratio_of_ideal": round(result["events_per_s"] / ideal, 3),
                "per_session_order_ok": self.order_ok(users),
            }
        )
        return result

    def order_ok(self, users: list[int]) -> bool:
        with pymysql.connect(
            host=mysql_server().host, port=mysql_server().port, user="root", database=self.db.name
        ) as conn:
            cur = conn.cursor()
            cur.execute(
                "SELECT event_id, processed_at FROM memory_event_ledger WHERE user_id BETWEEN %s AND %s",
                (min(users), max(users)),
            )
            at = {k.decode() if isinstance(k, bytes) else k: v for k, v in cur.fetchall()}
        return len(at) == 2 * len(users) and all(at[f"bench-{u}-0"] < at[f"bench-{u}-1"] for u in users)

    async def service_rate(
        self,
        topic: str,
        total: int,
        workers: int,
        in_flight: int,
        publish: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Events/s after the warm-up, from the group's committed offsets; CPU from /proc."""
        group = f"bench-{uuid.uuid4().hex[:6]}"
        procs = [
            ServiceProcess("worker", self.env(topic, group, in_flight), name=f"bench-{group}-{i}").start(
                wait_ready=False
            )
            for i in range(workers)
        ]
        progress = Progress(self.broker.bootstrap, group, topic)
        await progress.start()
        try:
            for p in procs:
                p.wait_ready(90)
            if publish is not None:
                # Every worker holds its partitions before the first event arrives.
                await wait_assigned(procs, PARTITIONS)
                asyncio.get_running_loop().create_task(self.publish(topic, publish))
            # The rate is the slope between the first sample past the warm-up and the last one before
            # the end: both lag the work by up to one commit interval alike, and the drain at the end
            # (the last records in flight, the final commit) stays out of it.
            first_at, first_count, last_at, last_count, count = None, 0, 0.0, 0, 0
            first_cpu, first_machine, last_cpu, last_machine = 0.0, (0.0, 0.0), 0.0, (0.0, 0.0)
            deadline = time.monotonic() + 900
            while count < total and time.monotonic() < deadline:
                count = await progress.committed()
                now = time.perf_counter()
                if count >= min(WARM_UP_EVENTS, total // 10) and first_at is None:
                    first_at, first_count = now, count
                    first_cpu, first_machine = sum(map(process_cpu_s, procs)), machine_cpu_s()
                elif first_at is not None and count < total:
                    last_at, last_count = now, count
                    last_cpu, last_machine = sum(map(process_cpu_s, procs)), machine_cpu_s()
                await asyncio.sleep(PROGRESS_POLL_S)
            assert first_at is not None and count >= total, f"only {count}/{total} events committed"
            assert last_count > first_count, "the run ended before a second sample: raise its events"
            count = last_count
            cpu = last_cpu - first_cpu
            busy, elapsed = (b - a for a, b in zip(first_machine, last_machine, strict=True))
            rss = [peak_rss_mib(p) for p in procs]
        finally:
            await progress.stop()
            for p in procs:
                p.stop()
        return {
            "workers": workers,
            "events_per_s": round((count - first_count) / max(last_at - first_at, 1e-9), 1),
            "worker_cpu_ms_per_event": round(cpu * 1000 / max(count - first_count, 1), 2),
            "machine_cpu_busy": round(busy / max(elapsed, 1e-9), 2),
            "peak_rss_mib": max(rss),
        }

    def bare_reference(self, delay_s: float) -> float:
        """Case 2's reference, in a process of its own: an aiohttp POST and the statements through the
        raw driver per event, 16 in flight, against this run's model server answering after `delay_s`.
        Under case 3's latency each I/O completion wakes the loop on its own, which costs the bare
        loop half as much again as a model answering at once; the worker's figure comes from case 3,
        so its reference runs under the same latency."""
        self.llm.reset()
        self.llm.default_delay_s = delay_s
        out = subprocess.run(  # noqa: S603 - fixed arguments
            [sys.executable, "-m", "bench.cpu_profile", "--bare", self.llm.api_base],
            capture_output=True,
            text=True,
            check=True,
            cwd=HERE.parent,
        ).stdout
        return float(json.loads(out.splitlines()[-1])["bare_reference"])

    # -- case 6 ------------------------------------------------------------------------------------
    async def injection(self) -> dict[str, Any]:
        seed_injection_pool(self.db.name)
        user_ids = [random.randint(1, INJECT_USERS) for _ in range(INJECT_REQUESTS)]
        api = ServiceProcess("api", self.env("unused", "unused", 64), name="bench-api").start()
        try:
            async with httpx.AsyncClient(base_url=api.base_url) as client:
                answer = await client.get(
                    "/internal/v1/memory/injection",
                    params={"userId": 7, "projectKey": "proj-7"},
                    headers={"Authorization": f"Bearer {INTERNAL_TOKEN}"},
                )
            assert len(answer.json()["data"]["memories"]) == 20, answer.text
            await asyncio.to_thread(wrk, api.base_url, 3)  # warm up
            http = await asyncio.to_thread(wrk, api.base_url, 15)
        finally:
            api.stop()
        pool = await aiomysql.create_pool(
            host=mysql_server().host,
            port=mysql_server().port,
            user="root",
            db=self.db.name,
            maxsize=20,
            autocommit=True,
        )
        try:

            async def raw(u: int) -> None:
                async with pool.acquire() as conn, conn.cursor() as cur:
                    for scope, key, limit in (("PROJECT", f"proj-{u % 10}", 12), ("USER", "", 8)):
                        await cur.execute(RAW_WINDOW, (u, scope, key, limit))
                        await cur.fetchall()

            await load(raw, user_ids[:200])
            direct = await load(raw, user_ids)
        finally:
            pool.close()
            await pool.wait_closed()
        ratio = http["p99_ms"] / direct["p99_ms"]
        return case(
            http["p99_ms"],
            direct["p99_ms"],
            ratio,
            "≤ 2×",
            ratio <= 2,
            users=INJECT_USERS,
            memories_per_user=INJECT_PER_USER,
            clients=INJECT_CLIENTS,
            http_client="wrk -t2 -c50, 15 s",
            raw_sql_requests=INJECT_REQUESTS,
            http=http,
            raw_sql=direct,
        )


class Progress:
    """Events a consumer group has committed on a topic, read from the broker without joining it."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )
        self._partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def committed(self) -> int:
        offsets = [await self._consumer.committed(tp) for tp in self._partitions]
        return sum(o or 0 for o in offsets)


def event(user_id: int, session_id: int, seq: int, text: str = "benchmark") -> dict[str, Any]:
    return {
        "eventId": f"bench-{user_id}-{seq}" if text.startswith("bench-llm") else f"skip-{session_id}-{seq}",
        "occurredAt": "2026-12-02T10:00:00Z",
        "sessionId": session_id,
        "userId": user_id,
        "phase": "COMPLETED",
        "sessionType": "MAIN",
        "projectKey": None,
        "lastUserMessage": f"{text}: 请记住我喜欢用中文写报告,并且总是附上摘要。",
        "lastAssistantMessage": "好的。",
    }


def wrk(base_url: str, seconds: int) -> dict[str, float]:
    """wrk (C, Debian's package) as the HTTP client, so the client's own CPU does not weigh on the figure."""
    out = subprocess.run(  # noqa: S603 - fixed arguments
        [
            "/usr/bin/wrk",
            "-t2",
            f"-c{INJECT_CLIENTS}",
            f"-d{seconds}s",
            "-s",
            str(HERE / "injection.lua"),
            base_url,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BENCH_INJECT_USERS": str(INJECT_USERS), "BENCH_INTERNAL_TOKEN": INTERNAL_TOKEN},
    ).stdout
    figures = json.loads(out.split("JSON ", 1)[1].splitlines()[0])
    assert figures["errors"] == 0, out
    return {
        "p50_ms": round(figures["p50_ms"], 2),
        "p99_ms": round(figures["p99_ms"], 2),
        "requests_per_s": round(figures["requests"] / figures["seconds"], 1),
    }


async def bare_consume(bootstrap: str, topic: str, total: int) -> float:
    """The floor: aiokafka's own getmany loop decoding each value, no processing."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        count, first_at = 0, None
        while count < total:
            batch = await consumer.getmany(timeout_ms=1000, max_records=1000)
            for records in batch.values():
                for record in records:
                    json.loads(record.value)
                    count += 1
                if first_at is None and count:
                    first_at = time.perf_counter()
        assert first_at is not None
        return count / (time.perf_counter() - first_at)
    finally:
        await consumer.stop()


async def wait_assigned(procs: list[ServiceProcess], partitions: int) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(600):
            counts = [await scrape_gauge(client, p, "mao_memory_partitions_assigned") for p in procs]
            if sum(counts) == partitions and all(counts):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("partitions were not assigned to every worker")


async def scrape_gauge(client: httpx.AsyncClient, process: ServiceProcess, metric: str) -> float:
    text = (await client.get(f"{process.base_url}/metrics")).text
    return next((float(line.split()[1]) for line in text.splitlines() if line.startswith(metric + " ")), 0.0)


def process_cpu_s(process: ServiceProcess) -> float:
    """User and system CPU of the process, all its threads."""
    assert process.process is not None
    fields = Path(f"/proc/{process.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of every core since boot: busy/total over a window is the machine's load."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK"), sum(ticks) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(process: ServiceProcess) -> float:
    assert process.process is not None
    status = Path(f"/proc/{process.process.pid}/status").read_text()
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return round(kib / 1024, 1)


async def load(call: Any, user_ids: list[int]) -> dict[str, float]:
    """INJECT_CLIENTS concurrent clients sharing the user list; latency of every request."""
    latencies: list[float] = []
    queue = list(user_ids)

    async def client() -> None:
        while queue:
            u = queue.pop()
            started = time.perf_counter()
            await call(u)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(INJECT_CLIENTS)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
        "requests_per_s": round(len(ordered) / elapsed, 1),
    }


def seed_injection_pool(database: str) -> None:
    """10,000 users × 50 ACTIVE memories: 25 USER and 25 in one of ten projects."""
    with pymysql.connect(
        host=mysql_server().host, port=mysql_server().port, user="root", database=database
    ) as conn:
        cur = conn.cursor()
        for start in range(1, INJECT_USERS + 1, 500):
            rows = []
            for u in range(start, min(start + 500, INJECT_USERS + 1)):
                for i in range(INJECT_PER_USER):
                    scope, key = ("USER", "") if i % 2 else ("PROJECT", f"proj-{u % 10}")
                    content = f"用户{u}的第{i}条记忆"
                    rows.append((u, scope, key, content, dedup_hash(Scope(scope), key, content)))
            cur.executemany(
                "INSERT INTO memory_item (user_id, scope, project_key, content, source, status, dedup_hash,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, 'AUTO', 'ACTIVE', %s, NOW(6), NOW(6))",
                rows,
            )
            conn.commit()
        cur.execute("ANALYZE TABLE memory_item")


def _latency(name: str, figures: dict[str, float]) -> str:
    return f"{name} p50 {figures['p50_ms']} ms p99 {figures['p99_ms']} ms {figures['requests_per_s']} req/s"


def assemble(raw: dict[str, Any]) -> dict[str, Any]:
    """The seven cases, each as figure, reference, ratio and target, from the runs' raw figures."""
    latency, saturated = raw["latency_bound"], raw["saturated"]
    one, three = raw["one_worker"], raw["three_workers"]
    bare = raw["bare_reference_cpu_ms"]
    cpu = latency["worker_cpu_ms_per_event"]
    scale = three["events_per_s"] / one["events_per_s"]
    return {
        "skip_path": raw["skip_path"],
        "worker_cpu": case(
            cpu,
            bare,
            cpu / bare,
            "≤ 2×",
            cpu / bare <= 2,
            unit="ms CPU per extracted event (case 3's worker)",
            reference_is="the bare loop under case 3's load: 16 in flight, the model answering in 200 ms",
            bare_reference_at_once_ms=raw["bare_reference_at_once_cpu_ms"],
        ),
        "extraction_latency_bound": case(
            latency["events_per_s"],
            latency["ideal_events_per_s"],
            latency["ratio_of_ideal"],
            "≥ 0.9, order kept",
            latency["ratio_of_ideal"] >= 0.9 and latency["per_session_order_ok"],
            **latency,
        ),
        "extraction_saturated": case(
            saturated["events_per_s"],
            saturated["ideal_events_per_s"],
            saturated["ratio_of_ideal"],
            "none (where the machine saturates)",
            True,
            **saturated,
        ),
        "extraction_1_worker": case(
            one["events_per_s"], one["ideal_events_per_s"], one["ratio_of_ideal"], "", True, **one
        ),
        "extraction_3_workers": case(
            three["events_per_s"], one["events_per_s"], scale, "≥ 2.7× one worker", scale >= 2.7, **three
        ),
        "injection": raw["injection"],
        "peak_rss": peak_rss(saturated["peak_rss_mib"], raw["litellm_import_mib"]),
        "cpu_profile": raw["cpu_profile"],
        "full_pool_cpu": full_pool_cpu(raw["cpu_profile"]["cpu_ms_per_event"]),
        "full_pool_prompt": full_pool_prompt(raw["steady_state"]["full_pool_prompt"]),
        "steady_state_mix": raw["steady_state"]["steady_mix"],
        "round_trips": raw["round_trips"],
    }


def peak_rss(worker_mib: float, litellm_mib: float) -> dict[str, Any]:
    """The saturated worker against a bare `import litellm` measured in the same run."""
    limit = litellm_mib + RSS_ALLOWANCE_MIB
    return case(
        worker_mib,
        limit,
        worker_mib / limit,
        f"≤ import litellm + {RSS_ALLOWANCE_MIB} MiB",
        worker_mib <= limit,
        litellm_import_mib=litellm_mib,
    )


def full_pool_cpu(profile: dict[str, float]) -> dict[str, Any]:
    """CPU per extracted event with every user's pool full, against the same handler over empty pools."""
    full, empty = profile[cpu_profile_module.FULL_POOLS], profile[cpu_profile_module.EMPTY_POOLS]
    return case(full, empty, full / empty, "≤ 1.5×", full / empty <= 1.5, unit="ms CPU per extracted event")


def full_pool_prompt(prompt: dict[str, Any]) -> dict[str, Any]:
    """Prompt tokens of one extraction at a full pool; the target bounds what is not content."""
    ratio = prompt["overhead_ratio"]
    return case(
        prompt["prompt_tokens"],
        prompt["content_tokens"],
        ratio,
        "≤ system + 1.25 × content + conversation",
        ratio <= 1.25,
        **prompt,
    )


def met(result: dict[str, Any]) -> str:
    if not result["target"] or result["target"].startswith("none"):
        return "—"
    return "yes" if result["met"] else "no"


def cache_line(cache: dict[str, Any]) -> str:
    """USD per 1,000 events per priced model (`bench/cache_cost.py`)."""
    return "; ".join(
        f"{model} ${usd['without_cache']:.3f} without, ${usd['with_cache']:.3f} with"
        for model, usd in cache["usd_per_1000_events"].items()
    )


def steady_rows(c: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The cases of a user whose pool is full: CPU, one prompt's tokens, a steady-state mix's calls."""
    cpu, prompt, mix = c["full_pool_cpu"], c["full_pool_prompt"], c["steady_state_mix"]
    calls, tokens = mix["model_calls_per_1000"], mix["prompt_tokens_per_1000"]
    per_purpose = "; ".join(
        f"{purpose} {calls[purpose]} calls, {tokens[purpose]:,} prompt tokens" for purpose in sorted(calls)
    )
    return [
        (
            "8 CPU per extracted event, full pools vs empty",
            f"{cpu['figure']} vs {cpu['reference']} ms (the same handler, sessions of a project;"
            " 180 machine-made ACTIVE rows and 50 dismissed facts per user)",
            f"×{cpu['ratio']:.2f}",
            cpu,
        ),
        (
            "9 prompt tokens per extraction at a full pool",
            f"{prompt['figure']} tokens: system {prompt['system_tokens']}, memory contents"
            f" {prompt['content_tokens']} ({prompt['content_share']:.0%} of the prompt), conversation"
            f" {prompt['conversation_tokens']}",
            f"{prompt['ratio']:.2f}× the contents",
            prompt,
        ),
        (
            "10 model calls and tokens per 1,000 completed events, steady-state mix",
            f"{per_purpose} ({mix['users']} users with full pools; events "
            + ", ".join(f"{k} {v}" for k, v in sorted(mix["outcomes"].items()))
            + ")",
            f"{sum(calls.values()):.0f} calls",
            {"target": "none (a figure)", "met": True},
        ),
        (
            "10 cost of those calls at list prices, without and with a prompt cache",
            cache_line(mix["cache"]),
            ", ".join(f"{model} {share:.0%}" for model, share in mix["cache"]["read_share"].items())
            + " of prompt tokens read from the cache",
            {"target": "none (a figure)", "met": True},
        ),
    ]


def write_reports(results: dict[str, Any]) -> None:
    (HERE / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    c = results["cases"]
    skip, cpu, latency, saturated = (
        c["skip_path"],
        c["worker_cpu"],
        c["extraction_latency_bound"],
        c["extraction_saturated"],
    )
    one, three, inj, rss = c["extraction_1_worker"], c["extraction_3_workers"], c["injection"], c["peak_rss"]
    rows = [
        (
            "1 skip path",
            f"{skip['figure']} ev/s vs bare aiokafka {skip['reference']} ev/s (best of"
            f" {len(skip['bare_passes'])} passes each: {skip['service_passes']} vs {skip['bare_passes']})",
            f"ratio {skip['ratio']:.2f}",
            skip,
        ),
        (
            "2 worker CPU per extracted event",
            f"{cpu['figure']} ms vs bare reference {cpu['reference']} ms under the same 200 ms model"
            f" ({cpu['bare_reference_at_once_ms']} ms with the model answering at once)",
            f"×{cpu['ratio']:.2f}",
            cpu,
        ),
        (
            "3 extraction, 16 in flight, model 200 ms",
            f"{latency['figure']} ev/s vs ideal {latency['reference']:.0f}; "
            f"order ok: {latency['per_session_order_ok']}",
            f"{latency['ratio']:.2f} of ideal",
            latency,
        ),
        (
            "4 extraction, 64 in flight, model 200 ms",
            f"{saturated['figure']} ev/s (ideal {saturated['reference']:.0f}), "
            f"cores {saturated['machine_cpu_busy']:.0%} busy, "
            f"{saturated['worker_cpu_ms_per_event']} ms CPU per event",
            f"{saturated['ratio']:.2f} of ideal",
            saturated,
        ),
        (
            "5 scale-out, 8 in flight per worker",
            f"1 worker {one['figure']} ev/s → 3 workers {three['figure']} ev/s ({PARTITIONS} partitions)",
            f"×{three['ratio']:.2f}",
            three,
        ),
        (
            "6 injection p99, 50 clients",
            _latency("HTTP", inj["http"]) + "; " + _latency("raw SQL", inj["raw_sql"]),
            f"×{inj['ratio']:.2f}",
            inj,
        ),
        (
            "7 peak RSS (case 4's worker)",
            f"{rss['figure']} MiB vs a bare `import litellm` {rss['litellm_import_mib']} MiB",
            f"{rss['figure']} MiB",
            rss,
        ),
        *steady_rows(c),
    ]
    profile = c["cpu_profile"]["cpu_ms_per_event"]
    m = results["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"Machine: {m['cores']} cores, Python {m['python']}, {m['platform']}; run {results['started_at']}.",
        "Every case ran side by side in this one run, on the same Tansu broker, MariaDB and model server.",
        "",
        "| case | measured | figure | target | met |",
        "|---|---|---|---|---|",
        *[f"| {name} | {what} | {fig} | {r['target'] or '—'} | {met(r)} |" for name, what, fig, r in rows],
        "",
        "CPU per extracted event by variant (`bench/cpu_profile.py`, the handler in one process,",
        "16 in flight, the model answering at once in a process of its own):",
        "",
        "| variant | ms CPU per event |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in profile.items()],
        "",
        "Round trips per extracted event, counted by the server (`bench/round_trips.py`, sessions of a",
        "project, one new fact then the same fact restated per user): "
        + ", ".join(f"{pools} pools {n['Questions']}" for pools, n in c["round_trips"]["per_event"].items())
        + ".",
        "",
    ]
    (HERE / "RESULTS.md").write_text("\n".join(lines))


async def main() -> None:
    bench = Bench()
    try:
        raw: dict[str, Any] = {}
        raw["skip_path"] = await bench.skip_path()
        print("skip path", raw["skip_path"], flush=True)
        raw["latency_bound"] = await bench.extraction(workers=1, in_flight=16, sessions=SESSIONS)
        print("latency-bound", raw["latency_bound"], flush=True)
        raw["saturated"] = await bench.extraction(workers=1, in_flight=64, sessions=2 * SESSIONS)
        print("saturated", raw["saturated"], flush=True)
        raw["one_worker"] = await bench.extraction(workers=1, in_flight=8, sessions=SESSIONS)
        print("one worker", raw["one_worker"], flush=True)
        raw["three_workers"] = await bench.extraction(workers=3, in_flight=8, sessions=SESSIONS)
        print("three workers", raw["three_workers"], flush=True)
        raw["bare_reference_cpu_ms"] = bench.bare_reference(LLM_LATENCY_S)
        raw["bare_reference_at_once_cpu_ms"] = bench.bare_reference(0.0)
        raw["cpu_profile"] = cpu_profile()
        print("cpu profile", raw["cpu_profile"], flush=True)
        raw["steady_state"] = steady_state()
        print("steady state", raw["steady_state"], flush=True)
        raw["litellm_import_mib"] = litellm_import_peak_rss_mib()
        raw["round_trips"] = bench_module("bench.round_trips")
        raw["injection"] = await bench.injection()
        print("injection", raw["injection"], flush=True)
        bench.results["cases"] = assemble(raw)
        write_reports(bench.results)
    finally:
        bench.close()


def cpu_profile() -> dict[str, Any]:
    return bench_module("bench.cpu_profile")


def steady_state() -> dict[str, Any]:
    return bench_module("bench.steady_state", str(STEADY_EVENTS))


def bench_module(module: str, *args: str) -> dict[str, Any]:
    """A measurement in a process of its own; its last line of output is its JSON."""
    out = subprocess.run(  # noqa: S603 - fixed arguments
        [sys.executable, "-m", module, *args], capture_output=True, text=True, check=True, cwd=HERE.parent
    ).stdout
    return dict(json.loads(out.splitlines()[-1]))


def litellm_import_peak_rss_mib() -> float:
    """Peak RSS of a bare `python -c "import litellm"`, configured as the worker imports it, read by
    the child itself: a spawned child's `ru_maxrss` starts from its parent's (vfork), and this
    parent holds the whole bench."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    peak = "next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).strip()"
    code = f"import litellm; print({peak})"
    out = subprocess.run(  # noqa: S603 - fixed arguments
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    return round(int(out.splitlines()[-1].split()[1]) / 1024, 1)  # VmHWM is in KiB


if __name__ == "__main__":
    asyncio.run(main())
