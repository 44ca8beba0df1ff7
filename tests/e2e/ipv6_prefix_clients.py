"""Run by test_ipv6_clients.py inside a network namespace of its own, whose loopback holds fd00::/64
and fd00:0:0:1::/64: the production HTTP server on fd00::1, clients from many addresses of those
prefixes. Prints what each client got, as JSON."""

from __future__ import annotations

import asyncio
import json
import sys

from service.bootstrap import build_service
from service.config import Settings
from service.entrypoints.http.server import server_config
from service.entrypoints.process import Mode
from tests.support.live_http import _Server

HOST = "fd00::1"
PORT = 8080
PER_CLIENT = 4


async def held_get(source: str) -> tuple[int | None, asyncio.StreamWriter]:
    """One GET /healthz on a kept-alive connection from `source`: its status (None if closed)."""
    reader, writer = await asyncio.open_connection(HOST, PORT, local_addr=(source, 0))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    line = await asyncio.wait_for(reader.readline(), 5)
    return (int(line.split()[1]) if line else None), writer


async def main(database_url: str) -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=database_url,
        http_host=HOST,
        http_port=PORT,
        http_max_connections_per_client=PER_CLIENT,
    )
    service = build_service(settings, Mode.API)
    server = _Server(server_config(service.http, settings))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    one_prefix = [await held_get(f"fd00::a:{i + 1}") for i in range(PER_CLIENT + 2)]
    other_prefix = await held_get("fd00:0:0:1::7")
    print(json.dumps({"one_prefix": [s for s, _ in one_prefix], "other_prefix": other_prefix[0]}))
    for _, writer in [*one_prefix, other_prefix]:
        writer.close()
    server.should_exit = True
    await task
    await service.db.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
