"""Probes and scrapes against a service whose API connections are taken (`mao-memory api` as a child
process, default limits, loopback only): one client holding 512 idle keep-alive connections, eight
addresses filling every API slot, and connections that send half a request and stall. Probes go to
the ops port, clients bind to addresses of 127/8 to count as different clients. The figures land in
tests/output/probe-starvation.json."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from service.adapters.db.engine import upgrade_schema
from service.config import Settings
from service.entrypoints.http.server import OPS_MAX_CONNECTIONS_PER_CLIENT
from tests.support.live_http import Answer, read_answer
from tests.support.processes import OUTPUT, ServiceProcess
from tests.support.tokens import INTERNAL

pytestmark = pytest.mark.e2e

DEFAULTS = Settings(_env_file=None)  # type: ignore[call-arg]
TOTAL = DEFAULTS.http_max_connections
PER_CLIENT = DEFAULTS.http_max_connections_per_client
FLOOD = 512  # what the reported attack opened
PROBES = 20
PROBE_DEADLINE_S = 1.0  # each probe's answer, well inside a kubelet's default one-second timeout
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('probes') / 'memory.db'}"
    upgrade_schema(url)
    env = {"MEMORY_DATABASE_URL": url, "MEMORY_INTERNAL_TOKEN": INTERNAL, "MEMORY_LOG_LEVEL": "ERROR"}
    process = ServiceProcess("api", env, name="probe-starvation").start()
    yield process
    process.stop()
    (OUTPUT / "probe-starvation.json").write_text(json.dumps(FIGURES, indent=2) + "\n")


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(port: int, source: str) -> Connection:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


@pytest.fixture
async def held() -> AsyncIterator[list[Connection]]:
    """Connections a test keeps open, closed after it, and their slots given back."""
    connections: list[Connection] = []
    yield connections
    for _, writer in connections:
        writer.close()
    await asyncio.sleep(0.5)


def request(path: str, *headers: str, close: bool = False) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def keep_alive(port: int, source: str) -> tuple[Connection, int | None, float]:
    """One GET /healthz on a kept-alive connection: the connection, the status (None when the server
    closed without one) and how long the answer took; a refused connection is closed."""
    started = time.monotonic()
    reader, writer = await connect(port, source)
    writer.write(request("/healthz"))
    try:
        status_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    except (asyncio.IncompleteReadError, ConnectionError):
        return (reader, writer), None, time.monotonic() - started
    fields = dict(line.lower().split(b":", 1) for line in head.strip().split(b"\r\n"))
    await reader.readexactly(int(fields[b"content-length"]))
    return (reader, writer), int(status_line.split()[1]), time.monotonic() - started


async def flood(port: int, sources: list[str], per_source: int, held: list[Connection]) -> dict[str, int]:
    """`per_source` kept-alive connections from each source at once; the served ones are held."""
    results = await asyncio.gather(*(keep_alive(port, s) for s in sources for _ in range(per_source)))
    counts: dict[str, int] = {}
    for connection, status, _ in results:
        counts[str(status)] = counts.get(str(status), 0) + 1
        held.append(connection)
    return counts


async def exchange(port: int, source: str, raw: bytes) -> Answer:
    reader, writer = await connect(port, source)
    try:
        writer.write(raw)
        await writer.drain()
        return await read_answer(reader, wait_s=5)
    finally:
        writer.close()


async def probes(server: ServiceProcess, source: str = "127.0.0.1") -> list[Answer]:
    """What a kubelet does: a fresh connection per probe, liveness and readiness, plus a scrape."""
    paths = ["/healthz", "/readyz", "/metrics"]
    answers = [
        await exchange(server.ops_port, source, request(paths[i % 3], close=True)) for i in range(PROBES)
    ]
    assert [a.status for a in answers] == [200] * PROBES
    assert max(a.after_s for a in answers) < PROBE_DEADLINE_S
    return answers


def timing(answers: list[Answer]) -> dict[str, float]:
    return {"slowest_s": round(max(a.after_s for a in answers), 3), "probes": len(answers)}


async def test_one_client_holds_its_cap_and_no_more(server: ServiceProcess, held: list[Connection]) -> None:
    started = time.monotonic()
    results = await asyncio.gather(*(keep_alive(server.port, "127.0.0.1") for _ in range(FLOOD)))
    held.extend(connection for connection, _, _ in results)
    served = [r for r in results if r[1] == 200]
    refused = [r for r in results if r[1] != 200]
    assert len(served) == PER_CLIENT
    assert {r[1] for r in refused} == {503} and len(refused) == FLOOD - PER_CLIENT
    # Each refusal is read at once and its connection closed within the linger (1 s).
    assert max(elapsed for _, _, elapsed in refused) < 3.0
    closing = await asyncio.gather(*(read_answer(c[0], wait_s=3) for c, _, _ in refused))
    assert all(answer.closed for answer in closing)
    flood_s = time.monotonic() - started

    answers = await probes(server)
    other = await exchange(
        server.port,
        "127.0.0.2",
        request("/internal/v1/memory/injection?userId=42", f"Authorization: Bearer {INTERNAL}", close=True),
    )
    assert other.status == 200 and json.loads(other.body)["data"]["prompt"] == ""
    again = await exchange(server.port, "127.0.0.1", request("/healthz", close=True))
    assert again.status == 503 and b"too many connections from this address" in again.body
    FIGURES["one_client"] = {
        "opened": FLOOD,
        "served": len(served),
        "refused_503": len(refused),
        "slowest_refusal_s": round(max(e for _, _, e in refused), 3),
        "flood_and_closes_s": round(flood_s, 3),
        "ops_probes": timing(answers),
        "other_client_injection_s": round(other.after_s, 3),
    }


async def test_probes_are_answered_while_every_api_slot_is_taken(
    server: ServiceProcess, held: list[Connection]
) -> None:
    sources = [f"127.0.0.{10 + i}" for i in range(TOTAL // PER_CLIENT)]
    assert await flood(server.port, sources, PER_CLIENT, held) == {"200": TOTAL}
    full = await exchange(server.port, "127.0.0.3", request("/healthz", close=True))
    assert full.status == 503 and b"too many connections" in full.body
    answers = await probes(server)
    FIGURES["api_full"] = {"held": TOTAL, "addresses": len(sources), "ops_probes": timing(answers)}


async def test_half_sent_requests_starve_neither_the_probes_nor_other_clients(
    server: ServiceProcess, held: list[Connection]
) -> None:
    """Slowloris: heads that never end, from one address at the API port and at the ops port."""
    stalled = [await connect(server.port, "127.0.0.4") for _ in range(PER_CLIENT + 16)]
    over_ops_cap = OPS_MAX_CONNECTIONS_PER_CLIENT + 4
    stalled += [await connect(server.ops_port, "127.0.0.4") for _ in range(over_ops_cap)]
    held.extend(stalled)
    for _, writer in stalled:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    await asyncio.sleep(0.5)
    answers = await probes(server, "127.0.0.5")
    other = await exchange(server.port, "127.0.0.5", request("/healthz", close=True))
    assert other.status == 200
    over_api = await read_answer(stalled[PER_CLIENT][0], wait_s=2)
    over_ops = await read_answer(stalled[-1][0], wait_s=2)
    assert over_api.status == 503 and over_api.closed
    assert over_ops.status == 503 and over_ops.closed
    FIGURES["slowloris"] = {
        "stalled_api": PER_CLIENT + 16,
        "stalled_ops": over_ops_cap,
        "ops_probes": timing(answers),
    }


async def test_the_ops_port_serves_only_the_ops_routes(server: ServiceProcess) -> None:
    injection = request(
        "/internal/v1/memory/injection?userId=42", f"Authorization: Bearer {INTERNAL}", close=True
    )
    assert (await exchange(server.ops_port, "127.0.0.1", injection)).status == 404
    assert (await exchange(server.port, "127.0.0.1", request("/metrics", close=True))).status == 200
