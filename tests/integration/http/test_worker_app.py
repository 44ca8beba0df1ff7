"""A bare worker's HTTP side: the ops routes alone, on plain Starlette, with the envelope."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aiokafka import TopicPartition

from service.bootstrap import build_service
from service.entrypoints.process import Mode, Service
from tests.integration.http.conftest import settings_over
from tests.support.processes import MariaDbDatabase
from tests.support.tokens import INTERNAL, bearer, token


@pytest.fixture
async def worker(mariadb: MariaDbDatabase) -> AsyncIterator[Service]:
    # Nothing listens on the broker's address: the broker check fails.
    service = build_service(settings_over(mariadb, kafka_bootstrap="127.0.0.1:9"), Mode.WORKER)
    yield service
    assert service.consumption is not None
    await service.consumption.runner.close()
    await service.consumption.dead_letters.stop()
    await service.db.dispose()


@pytest.fixture
async def worker_http(worker: Service) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=worker.http)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        yield client


async def test_a_consumer_reading_a_re_created_log_again_is_ready_with_a_note(
    worker: Service, worker_http: httpx.AsyncClient
) -> None:
    assert worker.consumption is not None
    runner = worker.consumption.runner
    runner.alive, runner.catching_up = True, {TopicPartition("t", 3): 40, TopicPartition("t", 1): 7}
    checks = (await worker_http.get("/readyz")).json()["checks"]
    assert checks["consumer"] == "ok: reading partition 1, 3 again from its start: its log was re-created"
    runner.catching_up = {}
    assert (await worker_http.get("/readyz")).json()["checks"]["consumer"] == "ok"
    runner.alive = False


async def test_the_ops_routes_answer(worker_http: httpx.AsyncClient) -> None:
    health = await worker_http.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = await worker_http.get("/readyz")
    assert ready.status_code == 503
    answer = ready.json()
    broker = answer["checks"].pop("broker")
    assert answer == {"status": "unavailable", "checks": {"database": "ok", "consumer": "fail"}}
    # A broker that does not answer is explained: here, nothing listens.
    assert broker.startswith("fail: cannot connect to Kafka at 127.0.0.1:9 with PLAINTEXT: ")
    assert "ConnectionRefusedError" in broker
    scrape = await worker_http.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    assert "mao_memory_ready 0.0" in scrape.text
    head = await worker_http.head("/healthz")  # a probe may send HEAD: answered like GET, no body
    assert (head.status_code, head.content) == (200, b"")


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/api/v1/memory", 404, 40400),  # the API is not served here
        ("GET", "/internal/v1/memory/inject?userId=1", 404, 40400),
        ("GET", "/openapi.json", 404, 40400),
        ("GET", "/console/", 404, 40400),
        ("GET", "/healthz/", 404, 40400),  # no redirect built from the Host header
        ("POST", "/healthz", 405, 40500),
        ("DELETE", "/metrics", 405, 40500),
    ],
)
async def test_anything_else_is_refused_with_the_envelope(
    worker_http: httpx.AsyncClient, method: str, path: str, status: int, code: int
) -> None:
    headers = bearer(INTERNAL if path.startswith("/internal/") else token(1))
    response = await worker_http.request(method, path, headers=headers)
    assert response.status_code == status
    assert response.json()["code"] == code
    assert response.json()["data"] is None
    assert "location" not in response.headers


async def test_an_oversized_body_is_refused_before_any_route(worker_http: httpx.AsyncClient) -> None:
    response = await worker_http.post("/healthz", content=b"x" * (64 * 1024 + 1))
    assert response.status_code == 413
    assert response.json()["code"] == 41300
