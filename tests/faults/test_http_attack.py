"""A bounded attack on the real service (`mao-memory api` as a child process, loopback only, at most
50 connections at once, well under a minute): a header flood, slowly trickled heads, idle
connections, slowly trickled bodies, heads promising a body that never comes, pipelined requests
never read, and one connection too many. It records the server's resident memory before, at its
peak and after, and how fast each connection was ended, in tests/output/http-attack.json and a row of
the fault report. Every stalled connection must be ended within its read's wait (the server's
timeout plus 10 s); how much sooner is a figure of the report, not a bound: on a loaded 2-core
machine it varies by seconds."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.adapters.db.engine import upgrade_schema
from service.entrypoints.http.server import PIPELINE_DEPTH
from tests.faults.conftest import Report
from tests.support.live_http import Answer, read_answer
from tests.support.processes import OUTPUT, ServiceProcess

pytestmark = pytest.mark.e2e

FLOODERS = 20
FLOOD_BYTES = 16 * 1024 * 1024  # what each flooder would send, in 64 KiB writes
TRICKLERS = 15
IDLERS = 15
MAX_CONNECTIONS = 40  # the phase over the limit holds this many and opens 10 more
HEAD_TIMEOUT_S = 10.0  # the default
BODY_TIMEOUT_S = 10.0  # a third of the default, to keep the attack short
SLOW_BODIES = 20  # half with a Content-Length, half chunked
SILENT_BODIES = 5
PIPELINERS = 10
PIPELINED_BYTES = 1024 * 1024  # of GET /healthz, in one go, never read
MiB = 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class RssSampler:
    """The server's resident memory every 20 ms, from another thread so the attack never delays it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('attack') / 'memory.db'}"
    upgrade_schema(url)
    env = {
        "MEMORY_DATABASE_URL": url,
        "MEMORY_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "MEMORY_HTTP_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "MEMORY_LOG_LEVEL": "ERROR",
    }
    process = ServiceProcess("api", env, name="http-attack").start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
async def client(server: ServiceProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5) as http:
        yield http


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def flood(port: int) -> Answer:
    """An endless header: 16 MiB in 64 KiB writes unless the server ends it first."""
    reader, writer = await connect(port)
    started = time.monotonic()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
        for _ in range(FLOOD_BYTES // 65536):
            writer.write(b"a" * 65536)
            await writer.drain()
    except ConnectionError:
        pass
    answer = await read_answer(reader, wait_s=15)
    answer.after_s = time.monotonic() - started
    writer.close()
    return answer


async def trickle(port: int) -> Answer:
    """A head sent one byte every half second: it would take about a minute to finish."""
    reader, writer = await connect(port)
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 80 + b"\r\n\r\n"

    async def send() -> None:
        for byte in head:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.5)

    sender = asyncio.create_task(send())
    answer = await read_answer(reader, wait_s=HEAD_TIMEOUT_S + 10)
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    writer.close()
    return answer


async def idle(port: int) -> Answer:
    reader, writer = await connect(port)
    answer = await read_answer(reader, wait_s=HEAD_TIMEOUT_S + 10)
    writer.close()
    return answer


async def slow_body(port: int, chunked: bool) -> Answer:
    """A complete head, then its body one byte (or one 1-byte chunk) every half second."""
    reader, writer = await connect(port)
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: 1000"
    writer.write(b"POST /api/v1/memory HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing + b"\r\n\r\n")

    async def send() -> None:
        while True:
            await asyncio.sleep(0.5)
            writer.write(b"1\r\n \r\n" if chunked else b" ")
            await writer.drain()

    sender = asyncio.create_task(send())
    answer = await read_answer(reader, wait_s=BODY_TIMEOUT_S + 10)
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    writer.close()
    return answer


async def silent_body(port: int) -> Answer:
    """A head promising a body that never comes."""
    reader, writer = await connect(port)
    writer.write(b"POST /api/v1/console/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n")
    answer = await read_answer(reader, wait_s=BODY_TIMEOUT_S + 10)
    writer.close()
    return answer


async def pipeliner(port: int) -> Answer:
    """A megabyte of pipelined requests in one go, then nothing read for three seconds."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    started = time.monotonic()
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    try:
        writer.write(request * (PIPELINED_BYTES // len(request)))
        await writer.drain()
    except ConnectionError:
        pass
    await asyncio.sleep(3)
    answer = await read_answer(reader, wait_s=5)
    answer.after_s = time.monotonic() - started
    writer.close()
    return answer


def summary(answers: list[Answer]) -> dict[str, Any]:
    return {
        "connections": len(answers),
        "statuses": sorted({str(a.status) for a in answers}),
        "closed": sum(a.closed for a in answers),
        "slowest_close_s": round(max(a.after_s for a in answers), 2),
    }


async def test_a_bounded_attack_is_refused_and_memory_returns_to_its_baseline(
    server: ServiceProcess, client: httpx.AsyncClient, report: Report
) -> None:
    assert server.process is not None
    pid, port = server.process.pid, server.port
    for _ in range(20):  # warm the paths the attack and the checks use
        assert (await client.get("/healthz")).status_code == 200
    await asyncio.sleep(1)
    baseline = rss(pid)
    figures: dict[str, Any] = {"baseline_rss_mib": round(baseline / MiB, 1)}
    started = time.monotonic()

    with RssSampler(pid) as sampler:
        flooded = await asyncio.gather(*(flood(port) for _ in range(FLOODERS)))
        figures["header_flood"] = summary(flooded)

        slow = asyncio.gather(
            *(trickle(port) for _ in range(TRICKLERS)), *(idle(port) for _ in range(IDLERS))
        )
        await asyncio.sleep(1)
        served_meanwhile = (await client.get("/healthz")).status_code
        stalled = await slow
        figures["slow_heads"] = summary(stalled[:TRICKLERS])
        figures["idle"] = summary(stalled[TRICKLERS:])
        figures["served_during_slow_heads"] = served_meanwhile

        bodies = asyncio.gather(
            *(slow_body(port, chunked=i % 2 == 1) for i in range(SLOW_BODIES)),
            *(silent_body(port) for _ in range(SILENT_BODIES)),
            *(pipeliner(port) for _ in range(PIPELINERS)),
        )
        await asyncio.sleep(1)
        served_during_bodies = (await client.get("/healthz")).status_code
        late = await bodies
        figures["slow_bodies"] = summary(late[:SLOW_BODIES])
        figures["silent_bodies"] = summary(late[SLOW_BODIES : SLOW_BODIES + SILENT_BODIES])
        pipelined = late[SLOW_BODIES + SILENT_BODIES :]
        figures["pipelined"] = summary(pipelined)
        figures["pipelined"]["answered"] = sum(a.body.count(b"HTTP/1.1 ") + 1 for a in pipelined)
        figures["served_during_slow_bodies"] = served_during_bodies

        held = [await connect(port) for _ in range(MAX_CONNECTIONS)]
        await asyncio.sleep(0.2)
        extra = [await connect(port) for _ in range(50 - MAX_CONNECTIONS)]
        beyond = await asyncio.gather(*(read_answer(reader, wait_s=5) for reader, _ in extra))
        for _, writer in held + extra:
            writer.close()
        figures["over_the_limit"] = summary(beyond)

        await asyncio.sleep(2)
        figures["peak_rss_mib"] = round(sampler.peak / MiB, 1)
    final = rss(pid)
    figures["final_rss_mib"] = round(final / MiB, 1)
    figures["attack_s"] = round(time.monotonic() - started, 1)
    figures["served_after"] = (await client.get("/healthz")).status_code
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "http-attack.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))

    assert figures["header_flood"]["statuses"] == ["431"]
    assert figures["header_flood"]["closed"] == FLOODERS
    for phase in ("slow_heads", "idle"):
        assert figures[phase]["closed"] == figures[phase]["connections"]
        assert figures[phase]["statuses"] == ["None"]  # closed without an answer
    for phase in ("slow_bodies", "silent_bodies"):
        assert figures[phase]["closed"] == figures[phase]["connections"]
        assert figures[phase]["statuses"] == ["408"]
    assert figures["pipelined"]["closed"] == PIPELINERS
    assert figures["pipelined"]["answered"] <= PIPELINERS * (1 + PIPELINE_DEPTH + 1)
    assert all(a.body.endswith(b'"too many pipelined requests", "data": null}') for a in pipelined)
    assert figures["served_during_slow_heads"] == 200 and figures["served_after"] == 200
    assert figures["served_during_slow_bodies"] == 200
    assert figures["over_the_limit"]["statuses"] == ["503"]
    assert figures["over_the_limit"]["closed"] == 50 - MAX_CONNECTIONS
    assert sampler.peak - baseline < 32 * MiB
    assert final - baseline < 4 * MiB
    closes = ", ".join(
        f"{phase} {figures[phase]['slowest_close_s']} s"
        for phase in ("slow_heads", "idle", "slow_bodies", "silent_bodies")
    )
    report.add(
        "HTTP attack: header flood, slow and idle heads, slow and silent bodies, pipelining, over the limit",
        faults=FLOODERS + TRICKLERS + IDLERS + SLOW_BODIES + SILENT_BODIES + PIPELINERS + 50,
        note=f"slowest close after the {HEAD_TIMEOUT_S:g} s timeouts: {closes}; RSS peak "
        f"+{(sampler.peak - baseline) / MiB:.1f} MiB, after +{(final - baseline) / MiB:.1f} MiB",
    )
