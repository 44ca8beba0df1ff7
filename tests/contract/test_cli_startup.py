"""Commands that call no model start fast: `dev-token`, in a child process, loads neither the web,
database, Kafka nor model stack."""

from __future__ import annotations

import os
import subprocess
import sys

HEAVY = {
    "litellm",
    "openai",
    "aiohttp",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "sqlalchemy",
    "alembic",
    "aiokafka",
    "structlog",
    "prometheus_client",
}
PROBE = """
import sys
from service.main import main
main(["dev-token", "--user", "1"])
print(",".join(sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1].split(",")))))
"""


def probe(code: str, names: set[str] | list[str], **env: str) -> str:
    """What a child running `code` prints, given `names` as its argument."""
    made = subprocess.run(
        [sys.executable, "-c", code, ",".join(names)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout


def test_dev_token_loads_no_heavy_library() -> None:
    printed = probe(PROBE, HEAVY, MEMORY_JWT_SECRET="startup-secret-startup-secret-0123456789")
    token, loaded = printed.splitlines()
    assert token.count(".") == 2
    assert loaded == "", f"dev-token imported {loaded}"


WORKER_PROBE = """
import asyncio, sys
from service import bootstrap
from service.config import Settings
from service.entrypoints.process import Mode

async def build():
    settings = Settings(_env_file=None, kafka_bootstrap="127.0.0.1:9", jwt_secret="w" * 40)
    return bootstrap.build_service(settings, Mode.WORKER)

service = asyncio.run(build())
print(type(service.http).__name__, ",".join(sorted(set(sys.argv[1].split(",")) & set(sys.modules))))
"""
API_ONLY = ["fastapi", "service.app.memories", "service.entrypoints.http.api_app", "jwt"]


def test_a_bare_worker_builds_without_the_apis_libraries() -> None:
    """Its HTTP side is three ops routes: FastAPI and the API's modules would cost it 8 MiB."""
    printed = probe(WORKER_PROBE, API_ONLY, LITELLM_LOCAL_MODEL_COST_MAP="True").split()
    app, loaded = printed[0], printed[1:]
    assert app == "Starlette"
    assert loaded == [], f"a bare worker imported {loaded}"
