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


def test_dev_token_loads_no_heavy_library() -> None:
    made = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(HEAVY)],
        env={**os.environ, "MEMORY_JWT_SECRET": "startup-secret-startup-secret-0123456789"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    token, loaded = made.stdout.splitlines()
    assert token.count(".") == 2
    assert loaded == "", f"dev-token imported {loaded}"
