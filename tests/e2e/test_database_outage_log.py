"""A database outage answered as 503 is one WARNING line in the service's log: no ERROR, no
traceback, no SQL. The real `mao-memory api` process, its real logging, a real cut connection."""

from __future__ import annotations

import json

import httpx

from tests.support.processes import MariaDbDatabase, ServiceProcess
from tests.support.tcp_proxy import TcpProxy
from tests.support.tokens import SECRET, bearer, token


def test_a_database_outage_is_one_warning_line_per_503(mariadb: MariaDbDatabase) -> None:
    server = mariadb.server
    proxy = TcpProxy(server.host, server.port).start()
    proxied = mariadb.url.replace(f"{server.host}:{server.port}", f"127.0.0.1:{proxy.port}")
    service = ServiceProcess(
        "api", {"MEMORY_DATABASE_URL": proxied, "MEMORY_JWT_SECRET": SECRET}, name="outage-log"
    )
    service.log_path.unlink(missing_ok=True)
    service.start()
    try:
        proxy.cut()
        answers = [
            httpx.get(f"{service.base_url}/api/v1/memory", headers=bearer(token(7)), timeout=30)
            for _ in range(3)
        ]
    finally:
        assert service.stop() == 0
        proxy.cut()
    assert [(a.status_code, a.json()) for a in answers] == [
        (503, {"code": 50300, "message": "database unavailable", "data": None})
    ] * 3
    text = service.log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert all(line.startswith("{") for line in text.splitlines()), text  # nothing but JSON lines
    outage = [line for line in lines if line.get("event") == "http_database_unavailable"]
    assert len(outage) == 3 and {line["level"] for line in outage} == {"warning"}
    assert not [line for line in lines if line.get("level") in {"error", "critical"}], text
    assert "Traceback" not in text and "Exception in ASGI application" not in text
    assert "SELECT" not in text and "[SQL:" not in text
