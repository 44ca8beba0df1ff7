"""The deployment files read as text: the Dockerfile's stages, user, health check and entry point
(tests/contract/test_deploy.py runs the tools on the others)."""

from __future__ import annotations

import re
from pathlib import Path

from service.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_is_multi_stage_non_root_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert len(stages) == 2 and stages[1].startswith("python:3.11-slim")
    final = stages[1]
    assert "build-essential" not in final and "apt-get" not in final  # no compilers in the image
    assert re.search(r"^USER mao$", final, re.MULTILINE)
    assert "HEALTHCHECK" in final and "/healthz" in final
    assert 'ENTRYPOINT ["mao-memory"]' in final and 'CMD ["run"]' in final
    assert "COPY --chown=mao:mao migrations ./migrations" in final


def test_the_image_checks_its_health_on_the_ops_port() -> None:
    """The API's connection slots can all be taken by clients; the ops port's cannot."""
    defaults = Settings(_env_file=None)  # type: ignore[call-arg]
    final = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)[-1]
    assert re.search(rf"^EXPOSE {defaults.http_port} {defaults.ops_port}$", final, re.MULTILINE)
    assert f"MEMORY_OPS_PORT={defaults.ops_port}" in final
    assert f"http://127.0.0.1:{defaults.ops_port}/healthz" in final
