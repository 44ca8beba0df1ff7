"""The command line a newcomer meets first: a first run without set-up gets throwaway credentials,
and a run with a secret or a real Kafka does not."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from service.config import Settings
from service.entrypoints.cli import _with_throwaway_credentials
from service.entrypoints.http.auth import Authenticator
from service.entrypoints.http.console_routes import SIGN_IN_CODES

SECRET = "cli-secret-cli-secret-cli-secret-0123456789"


def caller(settings: Settings, token: str) -> tuple[int, frozenset[str]]:
    request = Request({"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]})
    found = Authenticator(settings).caller(request)
    return found.user_id, found.permissions


def test_a_first_run_on_embedded_defaults_gets_throwaway_credentials(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = _with_throwaway_credentials(Settings(_env_file=None))  # type: ignore[call-arg]
    printed = capsys.readouterr().out
    assert settings.jwt_secret is not None and settings.internal_token is not None
    Settings.model_validate(settings.model_dump())  # the throwaway secrets pass the rules for real ones
    token = printed.split("token:")[1].split()[0]
    code = printed.split("http://127.0.0.1:8080/console/#code=")[1].split()[0]
    assert caller(settings, token) == (1, frozenset({"memory:read", "memory:admin"}))
    assert token not in printed.split("console:")[1].split()[0]
    assert SIGN_IN_CODES.redeem(code) == token and SIGN_IN_CODES.redeem(code) is None  # once
    again = _with_throwaway_credentials(Settings(_env_file=None))  # type: ignore[call-arg]
    assert again.jwt_secret is not None
    assert again.jwt_secret.get_secret_value() != settings.jwt_secret.get_secret_value()  # per run


@pytest.mark.parametrize(
    "configured",
    [{"jwt_secret": SECRET}, {"kafka_bootstrap": "kafka:9092"}],
)
def test_no_throwaway_credentials_with_a_secret_or_a_real_kafka(
    configured: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(_env_file=None, **configured)  # type: ignore[arg-type]
    assert _with_throwaway_credentials(settings) is settings
    assert capsys.readouterr().out == ""
