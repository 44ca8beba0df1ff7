"""The service's HTTP server (the production uvicorn configuration) in this process, on a free port,
and raw connections to it: what a hostile client does happens below any HTTP client library."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from service.bootstrap import build_service
from service.config import Settings
from service.entrypoints.http.server import server_config
from service.entrypoints.process import Mode
from tests.support.processes import free_port


class _Server(uvicorn.Server):
    def capture_signals(self):  # type: ignore[no-untyped-def]
        return contextlib.nullcontext()


@asynccontextmanager
async def live_server(
    settings: Settings, mode: Mode = Mode.API, send_buffer: int | None = None
) -> AsyncIterator[int]:
    """Serves `settings`' app on a free port of 127.0.0.1 and yields the port. `send_buffer` sets the
    kernel's send buffer of every accepted connection (they inherit the listener's), so that a
    client that stops reading fills the server's own buffer within a few answers."""
    settings = settings.model_copy(update={"http_host": "127.0.0.1", "http_port": free_port()})
    service = build_service(settings, mode)
    server = _Server(server_config(service.http, settings))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        if send_buffer is not None:
            for listener in server.servers:
                for sock in listener.sockets:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        yield settings.http_port
    finally:
        server.should_exit = True
        await task
        await service.db.dispose()


@dataclass
class Answer:
    status: int | None  # None: the connection ended without a response
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection (EOF or reset) within the wait
    after_s: float  # how long until the answer was complete and the connection closed (or the wait ended)


async def read_answer(reader: asyncio.StreamReader, wait_s: float = 5.0) -> Answer:
    """Everything the server sends until it closes the connection, or `wait_s` passes."""
    started = time.monotonic()
    received = b""
    closed = False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s):
            try:
                while chunk := await reader.read(65536):
                    received += chunk
            except ConnectionError:
                pass
            closed = True
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n") if head else []
    status = int(lines[0].split()[1]) if lines else None
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(status, headers, body, closed, time.monotonic() - started)


async def exchange(port: int, request: bytes, wait_s: float = 5.0) -> Answer:
    """One request on a fresh connection, then everything until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await read_answer(reader, wait_s)
    finally:
        writer.close()
