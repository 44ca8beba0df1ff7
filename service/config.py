"""Service configuration, read once from `MEMORY_*` environment variables (or a `.env` file)."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.core.extraction_prompt import CONVERSATION_TOKENS
from service.core.model import MAX_MODEL_NAME_CHARS
from service.core.project_keys import RobotKeys

MIN_JWT_SECRET_BYTES = 32
DEFAULT_SQLITE_URL = f"sqlite+aiosqlite:///{Path('data') / 'mao-memory.db'}"
# The model client's `StructuredOutput` values, spelled out so that reading the configuration does
# not import the client (and aiohttp) into every command; tests/unit/test_cli_startup.py keeps them equal.
StructuredOutputMode = Literal["auto", "json_schema", "json_object", "off"]
ENV_FILE_VARIABLE = "MEMORY_ENV_FILE"


def dotenv_file() -> str | None:
    """The dotenv file the command line reads: `.env` in the working directory unless
    MEMORY_ENV_FILE names another, none when it is empty (the test suite's setting, which every
    process a test starts inherits)."""
    return os.environ.get(ENV_FILE_VARIABLE, ".env") or None


class Settings(BaseSettings):
    """Everything the composition root needs; invalid values stop the process at start. `Settings()`
    reads the environment only: the command line adds the dotenv file (`dotenv_file`)."""

    model_config = SettingsConfigDict(env_prefix="MEMORY_", extra="ignore")

    database_url: str = DEFAULT_SQLITE_URL
    database_pool_size: int = Field(default=10, ge=1, le=200)

    kafka_bootstrap: str | None = None
    kafka_topic: str = Field(default="task.finished", min_length=1)
    kafka_dlq_topic: str | None = None
    kafka_group_id: str = Field(default="mao-memory", min_length=1)
    kafka_create_topics: bool = True
    kafka_partitions: int = Field(default=12, ge=1)
    kafka_session_timeout_ms: int = Field(default=10_000, ge=1_000)
    embedded_kafka_port: int = Field(default=9092, ge=1, le=65535)
    # Every Kafka client the service opens (docs/operations.md, "Secured Kafka").
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    # A mounted secret (Kubernetes, compose): the file's content is the password, a final newline cut.
    kafka_sasl_password_file: Path | None = None
    kafka_ssl_cafile: str | None = None  # unset: the system's trust store
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    kafka_ssl_check_hostname: bool = True
    # The dead-letter topic: acks=all always; idempotence off only for a broker without it (Tansu).
    kafka_dlq_idempotence: bool = True
    kafka_dlq_replication_factor: int | None = Field(default=None, ge=1)  # unset: the broker's default
    kafka_dlq_min_insync_replicas: int | None = Field(default=None, ge=1)  # unset: the broker's default
    # Dead letters carry conversations: how long the DLQ topic, when the service creates it, keeps them.
    kafka_dlq_retention_days: float = Field(default=7.0, gt=0)

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    # /healthz, /readyz and /metrics on a listener of their own, which a full API port cannot starve.
    ops_port: int = Field(default=8081, ge=0, le=65535)
    api_docs: bool = True  # the interactive API page at /docs
    # Hostile clients (docs/api.md): open connections, a request head's size and header count,
    # how long a connection may take to send a complete head, then its body, and to read answers.
    http_max_connections: int = Field(default=512, ge=1)
    http_max_connections_per_client: int = Field(default=64, ge=1)
    http_max_header_bytes: int = Field(default=32 * 1024, ge=1024)
    http_max_headers: int = Field(default=100, ge=8)
    http_head_timeout_s: float = Field(default=10.0, gt=0)
    http_body_timeout_s: float = Field(default=30.0, gt=0)
    http_send_timeout_s: float = Field(default=30.0, gt=0)

    jwt_secret: SecretStr | None = None
    jwt_previous_secret: SecretStr | None = None  # still accepted while tokens signed with it expire
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # Clock skew forgiven on exp, nbf and iat: an identity provider's clock a little ahead of this
    # host's must not make every fresh token "not valid yet".
    jwt_leeway_s: float = Field(default=30.0, ge=0, le=300)
    internal_token: SecretStr | None = None

    default_model: str = Field(default="openai/gpt-4o-mini", min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    llm_api_base: str | None = None
    llm_api_key: SecretStr | None = None
    llm_timeout_s: float = Field(default=30.0, gt=0)
    llm_max_retries: int = Field(default=2, ge=0, le=10)
    llm_retry_base_s: float = Field(default=0.5, ge=0)
    llm_structured_output: StructuredOutputMode = "auto"
    # 3 facts x 120 characters (up to ~2 tokens each in CJK) plus JSON: ~850 tokens; a local server's
    # default is unlimited, and one answer ran to the end of its context.
    llm_max_tokens: int = Field(default=1024, ge=64)
    llm_consolidation_max_tokens: int = Field(default=8192, ge=256)
    # The user's message and the assistant's reply in an extraction prompt, together, in estimated
    # tokens: the head of the message and the end of the reply are kept (core/conversation_bound.py).
    llm_conversation_tokens: int = Field(default=CONVERSATION_TOKENS, ge=200)
    # Users whose extraction prompt layout the process holds, so that their next prompt extends the
    # last as a prefix a provider's cache serves (core/prompt_layout.py); 0 lays out every prompt afresh.
    llm_prompt_layouts: int = Field(default=1000, ge=0)
    # The memory those layouts may take in all, in MiB: the least recently served are let go first.
    llm_prompt_layouts_mib: float = Field(default=16.0, ge=0)
    llm_breaker_failures: int = Field(default=5, ge=1)
    llm_breaker_open_s: float = Field(default=10.0, gt=0)
    llm_breaker_max_open_s: float = Field(default=300.0, gt=0)
    # The breaker opens only when the model answered nothing for this long as well: a few poison
    # events failing together while other calls are answered are not an outage.
    llm_breaker_quiet_s: float = Field(default=10.0, ge=0)
    # An event whose own model calls failed this often while the model answered other calls goes to
    # the dead-letter topic as `model_failed` (core/failure_budget.py); outages do not count.
    llm_event_failures: int = Field(default=3, ge=1)
    # "Answered other calls": within this many seconds of the failure (timeouts: overtaken instead).
    llm_event_failure_window_s: float = Field(default=60.0, gt=0)
    # Reasoning models only (gpt-5*, the o-series): unset means the lowest effort the model takes.
    llm_reasoning_effort: str | None = None
    # Room for a reasoning model's hidden reasoning on top of the answer cap: the model spends it
    # inside the completion budget, and an answer cut by the cap is lost. Billed only when spent.
    llm_reasoning_tokens: int = Field(default=4096, ge=0)

    # The robot channels' special projectKey values (docs/architecture.md, "Robot-channel keys").
    robot_project_keys: Annotated[frozenset[str], NoDecode] = frozenset({"WEIXIN", "FEISHU", "DINGTALK"})
    robot_project_key_prefixes: Annotated[frozenset[str], NoDecode] = frozenset(
        {"WEIXIN:", "FEISHU:", "DINGTALK:"}
    )

    max_in_flight: int = Field(default=64, ge=1, le=10_000)
    shutdown_grace_s: float = Field(default=20.0, ge=0)
    capture_cache_ttl_s: float = Field(default=5.0, ge=0)
    # The user's newest dismissals of the session's groups shown to the model as the negative list.
    negative_list_max: int = Field(default=200, ge=0)
    # Model calls per user in any 24 hours; beyond it an event is skipped (`skipped_budget`).
    extractions_per_user_per_day: int = Field(default=1000, ge=1)

    consolidation_active_threshold: int = Field(default=150, ge=1)
    consolidation_user_target: int = Field(default=30, ge=1)
    consolidation_project_target: int = Field(default=60, ge=1)
    consolidation_cooldown_hours: float = Field(default=24.0, ge=0)
    consolidation_retry_minutes: float = Field(default=60.0, ge=0)

    # Longer than the topic's retention: a ledger row must outlive every redelivery of its event.
    # At least a day: the daily extraction budget counts the last 24 hours of ledger rows.
    retention_ledger_days: float = Field(default=30.0, ge=1)
    retention_deleted_history_days: float = Field(default=365.0, gt=0)
    retention_interval_hours: float = Field(default=24.0, ge=0)  # 0: no periodic run in `worker`
    # How often each process reads the model-quality figures into its gauges; 0: never.
    quality_refresh_minutes: float = Field(default=15.0, ge=0)

    log_level: str = "INFO"

    @field_validator("robot_project_keys", "robot_project_key_prefixes", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("jwt_secret", "jwt_previous_secret", "internal_token", mode="before")
    @classmethod
    def _long_secret(cls, value: object) -> object:
        """HS256 needs a key as long as its hash (RFC 7518 3.2): a short one can be brute-forced
        from any token. The internal token is guessed against the service itself, one request per
        try: the same length keeps that out of reach. Empty means unset."""
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(text, str):
            if not text:
                return None
            if len(text.encode()) < MIN_JWT_SECRET_BYTES:
                raise ValueError(f"must be at least {MIN_JWT_SECRET_BYTES} bytes (`openssl rand -hex 32`)")
        return value

    @field_validator("jwt_issuer", "jwt_audience", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, value: str) -> str:
        if not value.startswith(("mysql+asyncmy://", "mysql+aiomysql://", "sqlite+aiosqlite://")):
            raise ValueError("must start with mysql+asyncmy://, mysql+aiomysql:// or sqlite+aiosqlite://")
        return value

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_list(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port…], got {server!r}")
        return value

    @field_validator("ops_port")
    @classmethod
    def _own_port(cls, value: int, info: ValidationInfo) -> int:
        """Two listeners on one port: the second would fail to bind after the first started."""
        if value and value == info.data.get("http_port"):
            raise ValueError(f"must differ from MEMORY_HTTP_PORT ({value})")
        return value

    @field_validator(
        "kafka_sasl_mechanism",
        "kafka_sasl_username",
        "kafka_sasl_password",
        "kafka_sasl_password_file",
        "kafka_ssl_cafile",
        "kafka_ssl_certfile",
        "kafka_ssl_keyfile",
        "kafka_dlq_replication_factor",
        "kafka_dlq_min_insync_replicas",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        """An empty variable (a compose file's `${VAR:-}`) means unset."""
        return None if value == "" else value

    @model_validator(mode="after")
    def _kafka_security(self) -> Settings:
        if self.kafka_sasl_password_file is not None:
            if self.kafka_sasl_password is not None:
                raise ValueError(
                    "set MEMORY_KAFKA_SASL_PASSWORD or MEMORY_KAFKA_SASL_PASSWORD_FILE, not both"
                )
            try:
                text = self.kafka_sasl_password_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"MEMORY_KAFKA_SASL_PASSWORD_FILE unreadable: {exc.strerror}") from None
            password = text.removesuffix("\n").removesuffix("\r")
            self.kafka_sasl_password = SecretStr(password) if password else None
        if self.kafka_security_protocol.startswith("SASL_"):
            needed = {
                "MEMORY_KAFKA_SASL_MECHANISM": self.kafka_sasl_mechanism,
                "MEMORY_KAFKA_SASL_USERNAME": self.kafka_sasl_username,
                "MEMORY_KAFKA_SASL_PASSWORD": self.kafka_sasl_password,
            }
            missing = [name for name, value in needed.items() if not value]
            if missing:
                raise ValueError(f"{self.kafka_security_protocol} needs {', '.join(missing)}")
        if (self.kafka_ssl_certfile is None) != (self.kafka_ssl_keyfile is None):
            raise ValueError("MEMORY_KAFKA_SSL_CERTFILE and MEMORY_KAFKA_SSL_KEYFILE go together")
        return self

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return upper

    @property
    def dlq_retention_ms(self) -> int:
        return round(self.kafka_dlq_retention_days * 86_400_000)

    @property
    def dlq_topic(self) -> str:
        return self.kafka_dlq_topic or f"{self.kafka_topic}.dlq"

    @cached_property
    def robot_keys(self) -> RobotKeys:
        return RobotKeys(self.robot_project_keys, tuple(sorted(self.robot_project_key_prefixes)))
