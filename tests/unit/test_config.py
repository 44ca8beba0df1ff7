"""Configuration that must stop the process at start, and the robot-channel key rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config import Settings
from service.core.model import MAX_MODEL_NAME_CHARS
from service.core.project_keys import RobotKeys


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_a_model_name_longer_than_its_column_is_refused_at_start() -> None:
    assert settings(default_model="m" * MAX_MODEL_NAME_CHARS).default_model == "m" * MAX_MODEL_NAME_CHARS
    with pytest.raises(ValidationError, match="at most 128 characters"):
        settings(default_model="m" * (MAX_MODEL_NAME_CHARS + 1))


def test_the_ledger_outlives_the_budgets_24_hour_window() -> None:
    """The daily budget counts ledger rows of the last 24 hours: retention may not delete them."""
    assert settings(retention_ledger_days=1).retention_ledger_days == 1
    with pytest.raises(ValidationError, match="retention_ledger_days"):
        settings(retention_ledger_days=0.5)


def test_the_ops_port_is_its_own() -> None:
    """Probes and scrapes get a listener of their own; sharing the API's port would fail to bind."""
    assert (settings().http_port, settings().ops_port) == (8080, 8081)
    assert settings(http_port=0, ops_port=0).ops_port == 0  # both chosen by the system
    with pytest.raises(
        ValidationError, match=r"ops_port\n  Value error, must differ from MEMORY_HTTP_PORT \(9000\)"
    ):
        settings(http_port=9000, ops_port=9000)


def test_one_client_gets_a_share_of_the_connections() -> None:
    assert (settings().http_max_connections_per_client, settings().http_max_connections) == (64, 512)
    with pytest.raises(ValidationError, match="http_max_connections_per_client"):
        settings(http_max_connections_per_client=0)


def test_robot_keys_default_to_the_platforms_channels_and_their_per_chat_prefixes() -> None:
    keys = settings().robot_keys
    assert [keys.project(k) for k in ("WEIXIN", "FEISHU", "DINGTALK")] == [None, None, None]
    assert keys.project("FEISHU:oc_5f2a") is None and keys.project("DINGTALK:cid-9") is None
    assert keys.project(" alpha ") == "alpha" and keys.project("WEIXINER") == "WEIXINER"


def test_robot_keys_come_from_comma_separated_variables() -> None:
    keys = settings(robot_project_keys="BOT, ", robot_project_key_prefixes="chat-,im/").robot_keys
    assert keys == RobotKeys(frozenset({"BOT"}), ("chat-", "im/"))
    assert [keys.project(k) for k in ("BOT", "chat-1", "im/x", "WEIXIN", "bot")] == [
        None,
        None,
        None,
        "WEIXIN",
        "bot",
    ]


@pytest.mark.parametrize("key", [None, "", "   ", "p" * 129])
def test_no_project_without_a_usable_key(key: str | None) -> None:
    assert RobotKeys().project(key) is None


def test_env_example_lists_every_setting_at_its_default() -> None:
    """`.env.example` is the newcomer's list of variables: none missing, none stale, defaults true."""
    lines = (Path(__file__).resolve().parents[2] / ".env.example").read_text().splitlines()
    listed = dict(line.removeprefix("# ").split("=", 1) for line in lines if line.startswith("# MEMORY_"))
    assert set(listed) == {f"MEMORY_{name.upper()}" for name in Settings.model_fields}
    explicit = {k.removeprefix("MEMORY_").lower(): v for k, v in listed.items() if v}
    documented_defaults = Settings(_env_file=None, **explicit)  # type: ignore[arg-type]
    for name in explicit:
        if name not in {"kafka_bootstrap", "kafka_dlq_topic"}:  # examples, not defaults
            assert getattr(documented_defaults, name) == getattr(settings(), name), name
