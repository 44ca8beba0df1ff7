"""The HTTP server against hostile clients, on the real uvicorn configuration over raw sockets:
header limits, the head, body and send timeouts, pipelining, trailers, the connection limit,
redirects and duplicated credentials."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.adapters.db.engine import upgrade_schema
from service.config import Settings
from service.entrypoints.http.server import KEEP_ALIVE_S, PIPELINE_DEPTH, server_config
from tests.support.live_http import exchange, live_server, read_answer
from tests.support.tokens import INTERNAL, SECRET, token

HEAD_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
SEND_TIMEOUT_S = 0.5
MAX_CONNECTIONS = 4
MAX_HEAD_BYTES = 8192


@pytest.fixture
async def port(tmp_path: Path) -> AsyncIterator[int]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=url,
        jwt_secret=SECRET,
        internal_token=INTERNAL,
        http_head_timeout_s=HEAD_TIMEOUT_S,
        http_body_timeout_s=BODY_TIMEOUT_S,
        http_send_timeout_s=SEND_TIMEOUT_S,
        http_max_connections=MAX_CONNECTIONS,
        http_max_header_bytes=MAX_HEAD_BYTES,
        http_max_headers=20,
    )
    async with live_server(settings, send_buffer=4096) as bound:
        yield bound


def get(path: str, *headers: str, host: str = "127.0.0.1") -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def envelope_code(body: bytes) -> int:
    return int(json.loads(body)["code"])


async def test_a_request_within_the_limits_is_served(port: int) -> None:
    padding = [f"X-Pad-{i}: {'p' * 300}" for i in range(16)]  # 16 of 20 headers, ~5 of 8 KiB
    answer = await exchange(port, get("/healthz", *padding))
    assert answer.status == 200 and answer.closed


async def test_a_body_that_arrives_with_its_head_is_not_counted_as_head(port: int) -> None:
    body = json.dumps({"scope": "USER", "content": "x" * 400, "pad": "y" * 30_000}).encode()
    request = (
        f"POST /api/v1/memory HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answer = await exchange(port, request)
    assert answer.status == 401  # reached the app: no token sent


async def test_a_header_flood_is_refused_with_431_and_the_connection_closed(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
    try:
        for _ in range(64):  # up to 4 MiB, never finished
            writer.write(b"a" * 65536)
            await writer.drain()
    except ConnectionError:
        pass  # refused and closed while still sending
    answer = await read_answer(reader)
    writer.close()
    assert answer.status == 431 and answer.closed
    assert answer.headers["connection"] == "close" and envelope_code(answer.body) == 43100


async def test_too_many_headers_are_refused_with_431(port: int) -> None:
    answer = await exchange(port, get("/healthz", *(f"X-H{i}: 1" for i in range(25))))
    assert answer.status == 431 and answer.closed and envelope_code(answer.body) == 43100


async def test_a_connection_sending_no_head_is_closed_after_the_head_timeout(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = await read_answer(reader, wait_s=5 * HEAD_TIMEOUT_S)
    writer.close()
    assert answer.closed and answer.status is None
    assert HEAD_TIMEOUT_S * 0.8 <= answer.after_s < HEAD_TIMEOUT_S * 3


async def test_a_head_trickled_byte_by_byte_is_closed_after_the_head_timeout(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = get("/healthz")

    async def trickle() -> None:
        for byte in request[:-2]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(HEAD_TIMEOUT_S / 10)

    sender = asyncio.create_task(trickle())
    answer = await read_answer(reader, wait_s=5 * HEAD_TIMEOUT_S)
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    writer.close()
    assert answer.closed and answer.status is None
    assert answer.after_s < HEAD_TIMEOUT_S * 3


async def test_a_kept_alive_connection_outlives_the_head_timeout_between_requests(port: int) -> None:
    """The head timeout must not cut the keep-alive a client relies on (it is KEEP_ALIVE_S)."""
    assert KEEP_ALIVE_S > 60
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    keep = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for _ in range(2):
        writer.write(keep)
        await writer.drain()
        status = await reader.readuntil(b"\r\n")
        assert b" 200 " in status
        await reader.readuntil(b'{"status":"ok"}')
        await asyncio.sleep(HEAD_TIMEOUT_S * 3)
    writer.close()


async def test_connections_beyond_the_limit_get_503_at_once(port: int) -> None:
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
    await asyncio.sleep(0.1)
    answer = await exchange(port, get("/healthz"), wait_s=2)
    assert answer.status == 503 and answer.closed and envelope_code(answer.body) == 50300
    _, writer = held.pop()
    writer.close()
    await asyncio.sleep(0.1)
    assert (await exchange(port, get("/healthz"))).status == 200
    for _, writer in held:
        writer.close()


async def test_a_trailing_slash_is_404_not_a_redirect_to_the_host_header(port: int) -> None:
    answer = await exchange(
        port,
        get(
            "/internal/v1/memory/injection/?userId=42",
            f"Authorization: Bearer {INTERNAL}",
            host="evil.example",
        ),
    )
    assert answer.status == 404 and "location" not in answer.headers
    assert envelope_code(answer.body) == 40400
    assert (await exchange(port, get("/healthz/"))).status == 404
    assert (await exchange(port, get("/no/such/path"))).status == 404


async def test_the_console_without_its_slash_redirects_relatively(port: int) -> None:
    """The one redirect the service makes names no host: a forged Host header cannot steer it."""
    answer = await exchange(port, get("/console", host="evil.example"))
    assert answer.status == 308 and answer.headers["location"] == "console/"


@pytest.mark.parametrize(
    "path", ["/console/.", "/console/%2e", "/console/./.", "/console/x/..", "/console/..%2fconsole"]
)
async def test_a_console_directory_without_its_slash_is_404_not_a_redirect(port: int, path: str) -> None:
    answer = await exchange(port, get(path, host="evil.example"))
    assert answer.status == 404 and "location" not in answer.headers
    assert envelope_code(answer.body) == 40400
    assert (await exchange(port, get("/console/"))).status == 200


def test_forwarded_headers_from_a_client_are_not_believed() -> None:
    """uvicorn would take X-Forwarded-For and -Proto from 127.0.0.1, so a client on the host could
    set its own address and scheme."""
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert server_config(object(), settings).proxy_headers is False


async def test_two_authorization_headers_are_refused(port: int) -> None:
    good = f"Authorization: Bearer {token(42)}"
    assert (await exchange(port, get("/api/v1/memory/settings", good))).status == 200
    twice = await exchange(port, get("/api/v1/memory/settings", good, "Authorization: Bearer x"))
    assert twice.status == 401 and envelope_code(twice.body) == 40100
    internal = f"Authorization: Bearer {INTERNAL}"
    doubled = await exchange(port, get("/internal/v1/memory/injection?userId=42", internal, internal))
    assert doubled.status == 401


async def test_the_sign_in_exchange_is_documented_as_taking_no_credentials(port: int) -> None:
    spec = json.loads((await exchange(port, get("/openapi.json"))).body)
    assert "security" not in spec["paths"]["/api/v1/console/session"]["post"]
    assert spec["paths"]["/api/v1/memory"]["get"]["security"] == [{"userJwt": []}]


async def test_a_head_over_the_limit_is_refused_when_it_arrives_in_one_read(port: int) -> None:
    answer = await exchange(port, get("/healthz", f"X-Big: {'b' * 2 * MAX_HEAD_BYTES}"))
    assert answer.status == 431 and answer.closed and envelope_code(answer.body) == 43100
    long_url = await exchange(port, get(f"/healthz?{'q' * 2 * MAX_HEAD_BYTES}"))
    assert long_url.status == 431


def post_head(path: str, framing: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize(
    ("framing", "trickle"),
    [
        ("Content-Length: 1000", b" "),  # promised, never sent in full
        ("Transfer-Encoding: chunked", b"1\r\n \r\n"),  # chunks that never end
        ("Content-Length: 10", b""),  # the head, then silence
    ],
)
@pytest.mark.parametrize("path", ["/api/v1/console/session", "/healthz"])
async def test_a_body_slower_than_the_body_timeout_gets_408_and_the_connection_closed(
    port: int, framing: str, trickle: bytes, path: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post_head(path, framing))

    async def send() -> None:
        while trickle:
            await asyncio.sleep(BODY_TIMEOUT_S / 5)
            writer.write(trickle)
            await writer.drain()

    sender = asyncio.create_task(send())
    answer = await read_answer(reader, wait_s=10 * BODY_TIMEOUT_S)
    sender.cancel()
    await asyncio.gather(sender, return_exceptions=True)
    writer.close()
    assert answer.status == 408 and answer.closed and envelope_code(answer.body) == 40800
    assert BODY_TIMEOUT_S * 0.8 <= answer.after_s < BODY_TIMEOUT_S * 4


async def test_a_slow_body_after_an_answer_is_cut_at_the_body_timeout(port: int) -> None:
    """A GET answers without reading its body: the connection still ends when the body is late."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n")
    answer = await read_answer(reader, wait_s=10 * BODY_TIMEOUT_S)
    writer.close()
    assert answer.status == 200 and answer.closed
    assert answer.after_s < BODY_TIMEOUT_S * 4


async def test_a_client_that_never_reads_its_answers_is_dropped_after_the_send_timeout(port: int) -> None:
    """Pipelined answers (within the pipeline depth) pile up in the server's buffer: the connection
    is dropped once the buffer has stayed full for the send timeout."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * PIPELINE_DEPTH)
    await writer.drain()
    await asyncio.sleep(10 * SEND_TIMEOUT_S)  # read nothing meanwhile
    answer = await read_answer(reader, wait_s=2)
    writer.close()
    assert answer.closed and answer.status == 200  # the answers sent before the drop, then the end
    assert answer.body.count(b'"openapi"') < PIPELINE_DEPTH


async def test_pipelined_requests_beyond_the_depth_get_503_after_the_earlier_answers(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 200)
    await writer.drain()
    answer = await read_answer(reader, wait_s=5)
    writer.close()
    # The first answer's head is parsed; its body runs on through every later answer.
    later = [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer.body)]
    assert answer.status == 200 and answer.closed and answer.after_s < 3
    assert [answer.status, *later] == [200] * (1 + PIPELINE_DEPTH) + [503]
    assert answer.body.endswith(b'"too many pipelined requests", "data": null}')


async def test_a_refusal_comes_after_the_earlier_answers_and_a_slow_reader_gets_them_all(
    tmp_path: Path,
) -> None:
    """A late body behind pipelined requests is refused in its turn: every earlier answer, still
    buffered for a client that has not read yet, is sent before the 408 and the close."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'memory.db'}"
    upgrade_schema(url)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=url, http_body_timeout_s=BODY_TIMEOUT_S, http_send_timeout_s=10
    )
    async with live_server(settings, send_buffer=4096) as patient:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", patient))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 6
            + post_head("/healthz", "Content-Length: 10")
        )
        await writer.drain()
        await asyncio.sleep(BODY_TIMEOUT_S * 3)  # the body is late, and nothing read yet
        answer = await read_answer(reader, wait_s=5)
        writer.close()
    later = [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer.body)]
    assert [answer.status, *later] == [200] * 6 + [408] and answer.closed
    assert answer.body.count(b'{"openapi":') == 6  # every answer whole


def chunked_post(path: str, body: bytes, trailer: bytes, *headers: str) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Connection: close",
        "Transfer-Encoding: chunked",
        *headers,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailer)


async def test_a_trailer_field_is_never_taken_as_a_header(port: int) -> None:
    body = json.dumps({"scope": "USER", "content": "只在尾部的凭据"}).encode()
    trailer = f"Authorization: Bearer {token(42)}\r\n".encode()
    answer = await exchange(
        port, chunked_post("/api/v1/memory", body, trailer, "Content-Type: application/json")
    )
    assert answer.status == 401 and envelope_code(answer.body) == 40100
    typed = await exchange(
        port,
        chunked_post(
            "/api/v1/memory",
            body,
            b"Content-Type: text/plain\r\n",
            "Content-Type: application/json",
            f"Authorization: Bearer {token(42)}",
        ),
    )
    assert typed.status == 201


async def test_an_endless_trailer_gets_413_and_the_connection_closed(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post_head("/api/v1/console/session", "Transfer-Encoding: chunked") + b"0\r\nX-Trailer: ")
    try:
        for _ in range(64):  # up to 4 MiB, never finished
            writer.write(b"t" * 65536)
            await writer.drain()
    except ConnectionError:
        pass  # refused and closed while still sending
    answer = await read_answer(reader)
    writer.close()
    assert answer.status == 413 and answer.closed and envelope_code(answer.body) == 41300
