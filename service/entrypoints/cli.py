"""`mao-memory run | worker | api | migrate | retention | erase-user | dev-token | dlq replay | settings |
eval`: the commands, given the composition root by `service.main`, the console script."""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol, TextIO

from pydantic import SecretStr, ValidationError

from service.config import Settings, dotenv_file

if TYPE_CHECKING:
    from service.app.retention import RetentionReport
    from service.core.eval_cases import EvalCase
    from service.entrypoints.process import Mode, Service

DEV_USER = 1
# `dlq replay` writes a progress line every this many messages read (and every few seconds).
REPLAY_PROGRESS_EVERY = 1000


class CompositionRoot(Protocol):
    """What the commands that run the service take from `service.bootstrap`, the layer above this one."""

    def configure_logging(self, level: str, stream: TextIO | None = None) -> None: ...

    def build_service(self, settings: Settings, mode: Mode) -> Service: ...

    async def run_retention_once(
        self, settings: Settings, progress: Callable[[RetentionReport], None] | None = None
    ) -> RetentionReport: ...

    async def erase_user(self, settings: Settings, user_id: int) -> dict[str, int]: ...
    async def run_eval(
        self,
        settings: Settings,
        models: list[str],
        cases: list[EvalCase],
        concurrency: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[dict[str, object]]: ...


def _load_settings() -> Settings:
    try:
        return Settings(_env_file=dotenv_file())
    except ValidationError as exc:
        lines = [
            f"  MEMORY_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            if e["loc"]
            else f"  {e['msg']}"  # a rule over several settings names them itself
            for e in exc.errors()
        ]
        print("mao-memory: invalid configuration\n" + "\n".join(lines), file=sys.stderr)
        raise SystemExit(2) from None


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"mao-memory: {message}", file=sys.stderr)
    raise SystemExit(code)


def _timestamp(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mao-memory", description="Long-term memory service for Mao agents")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "run",
        help="consumer and HTTP sidecar in one process",
        description="Consume task.finished and serve the HTTP API, the console, /healthz, /readyz and "
        "/metrics in one process until SIGTERM. Without MEMORY_KAFKA_BOOTSTRAP it starts an embedded "
        "broker; without MEMORY_JWT_SECRET it prints throwaway credentials. Settings: MEMORY_* "
        "variables or .env.",
    )
    commands.add_parser(
        "worker",
        help="the Kafka consumer only (with /healthz, /readyz, /metrics)",
        description="Consume task.finished until SIGTERM, serving only /healthz, /readyz and /metrics. "
        "Settings: MEMORY_* variables or .env.",
    )
    commands.add_parser(
        "api",
        help="the HTTP sidecar only",
        description="Serve the HTTP API and the console until SIGTERM, consuming nothing. Settings: "
        "MEMORY_* variables or .env.",
    )
    commands.add_parser(
        "migrate",
        help="apply pending schema migrations and exit",
        description="Bring the database at MEMORY_DATABASE_URL to the schema this version needs, then "
        "say from which revision to which.",
    )
    commands.add_parser(
        "retention",
        help="one retention run now (expired ledger rows, touch runs, old history); prints figures",
        description="Delete expired ledger rows, fold touch runs and delete old history once, now, with "
        "the MEMORY_RETENTION_* horizons; prints what it removed as JSON.",
    )
    erase = commands.add_parser(
        "erase-user",
        help="erase everything kept for a user (a closed account); prints rows removed",
        description="Delete every row kept for the user (memories, history, capture preference, "
        "projects, ledger and budget rows) in one transaction under the user's lock, as DELETE "
        "/internal/v1/memory/users/{userId} does; prints what it removed per table as JSON.",
    )
    erase.add_argument("user_id", type=int, metavar="USER_ID", help="the user id")
    token = commands.add_parser(
        "dev-token",
        help="print a JWT for a test user, signed with MEMORY_JWT_SECRET",
        description="Print a JWT for a test user, signed with MEMORY_JWT_SECRET, or with the throwaway "
        "secret of a `mao-memory run` in this directory.",
    )
    token.add_argument("--user", type=int, required=True, help="the user id (the token's sub)")
    token.add_argument("--admin", action="store_true", help="with memory:read and memory:admin")
    token.add_argument("--hours", type=float, default=12.0, help="lifetime (default 12)")
    _add_dlq(commands)
    _add_settings_parser(commands)
    _add_eval(commands)
    return parser


def _add_eval(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="score extraction models on the labelled set; prints a comparison table",
        description="Run every labelled case through the real extraction path (prompt, litellm client, "
        "answer guards, write decision) on a throwaway SQLite database, once per model, and score what "
        "each stored: recall, precision, false-memory resistance, updates, dismissals, language, tokens, "
        "cost, latency. Progress on stderr, the comparison table on stdout. The model is reached through "
        "the MEMORY_LLM_* settings unless the flags below say otherwise.",
    )
    evaluate.add_argument(
        "--model",
        action="append",
        help="a litellm model name, e.g. openai/gpt-4o-mini; repeat to compare several "
        "(default MEMORY_DEFAULT_MODEL)",
    )
    evaluate.add_argument(
        "--cases",
        type=Path,
        default=Path("eval/cases"),
        help="a .jsonl file or a directory of them (default eval/cases)",
    )
    evaluate.add_argument("--out", type=Path, help="write the per-model reports here as JSON")
    evaluate.add_argument(
        "--concurrency", type=int, default=8, help="cases in flight at once, across models (default 8)"
    )
    evaluate.add_argument("--api-base", help="the provider's URL (default MEMORY_LLM_API_BASE)")
    evaluate.add_argument("--api-key", help="the provider's key (default MEMORY_LLM_API_KEY)")
    evaluate.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _add_dlq(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dlq = commands.add_parser(
        "dlq", help="the dead-letter topic", description="Commands on the dead-letter topic."
    ).add_subparsers(dest="dlq_command", required=True)
    replay_cmd = dlq.add_parser(
        "replay",
        help="re-publish dead-lettered events to the main topic",
        description="Re-publish the dead letters not replayed yet to the main topic, each once: the "
        "consumer group MEMORY_KAFKA_GROUP_ID.dlq-replay[.REASON] remembers how far replays have read. "
        "Progress on stderr, a JSON summary on stdout.",
    )
    replay_cmd.add_argument("--reason", help="only this x-dlq-reason, e.g. model_rejected")
    replay_cmd.add_argument(
        "--since", type=_timestamp, help="only messages dead-lettered at or after this RFC 3339 time"
    )
    replay_cmd.add_argument(
        "--dry-run", action="store_true", help="count what would be replayed; publish and commit nothing"
    )
    replay_cmd.add_argument(
        "--from-beginning",
        action="store_true",
        help="read the topic from its start again, replaying letters earlier runs replayed",
    )
    replay_cmd.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _migrate(settings: Settings, _: argparse.Namespace) -> None:
    from sqlalchemy.exc import DBAPIError

    from service.adapters.db.engine import SCHEMA_HEAD, current_revision, upgrade_schema
    from service.entrypoints.progress import to_stderr

    try:
        before = current_revision(settings.database_url)
        upgrade_schema(
            settings.database_url, applied=lambda rev: to_stderr(f"migrate: revision {rev} applied")
        )
    except DBAPIError as exc:
        _fail(_unreachable(settings.database_url, exc), code=1)
    head = SCHEMA_HEAD
    if before == head:
        print(f"mao-memory: schema already at revision {head}")
    else:
        print(f"mao-memory: schema migrated from {before or 'nothing'} to revision {head}")


def _unreachable(url: str, exc: BaseException) -> str:
    """One line for a database `migrate` cannot use, instead of the driver's traceback; a missing
    database gets the statement that creates it (the schema's collation is the migrations' own)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from service.adapters.db.errors import error_code

    parts = make_url(url)
    sqlite = parts.get_backend_name() == "sqlite"
    where = parts.database if sqlite else f"{parts.host or 'localhost'}:{parts.port or 3306}"
    if error_code(exc) == ("mysql", 1049):
        return (
            f'database "{parts.database}" does not exist on {where}; create it with: '
            f"CREATE DATABASE `{parts.database}` CHARACTER SET utf8mb4"
        )
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return f"cannot use the database on {where}: {cause}"


def _retention(settings: Settings, _: argparse.Namespace, root: CompositionRoot) -> None:
    import uvloop

    from service.entrypoints.progress import Progress, to_stderr

    root.configure_logging(settings.log_level, sys.stderr)  # stdout is the figures' JSON
    ticks = Progress(to_stderr)

    def progress(report: RetentionReport) -> None:
        ticks.tick(report.transactions, lambda: f"retention: {report.line()} so far")

    report = uvloop.run(root.run_retention_once(settings, progress))
    print(json.dumps(report.as_dict()))
    to_stderr(f"retention done in {report.duration_s:.1f} s: {report.line()}")


def _erase_user(settings: Settings, args: argparse.Namespace, root: CompositionRoot) -> None:
    """The same erasure as `DELETE /internal/v1/memory/users/{userId}`; its log line, then its answer."""
    import uvloop

    from service.core.events import BIGINT_MAX

    if not 1 <= args.user_id <= BIGINT_MAX:
        _fail(f"USER_ID must be between 1 and {BIGINT_MAX}")
    root.configure_logging(settings.log_level)
    removed = uvloop.run(root.erase_user(settings, args.user_id))
    print(json.dumps({"userId": args.user_id, "removed": removed}), flush=True)


def _dev_token(settings: Settings, args: argparse.Namespace) -> None:
    """Signs with MEMORY_JWT_SECRET, else with the throwaway secret of the run in this directory."""
    from service.entrypoints import dev_credentials
    from service.entrypoints.tokens import mint_token

    if settings.jwt_secret is None:
        running = dev_credentials.running_secret()
        if running is None:
            _fail(
                "MEMORY_JWT_SECRET is not set, and no `mao-memory run` with throwaway credentials is "
                f"running in this directory (it would share them in {dev_credentials.PATH.resolve()}): "
                "a token signed with anything else would be refused"
            )
        pid, secret = running
        note = f"signed with the throwaway secret of run {pid}, valid while it runs"
        print(f"mao-memory: {note}", file=sys.stderr)
        settings = settings.model_copy(update={"jwt_secret": secret})
    print(mint_token(settings, args.user, admin=args.admin, lifetime=timedelta(hours=args.hours)))


def _dlq(settings: Settings, args: argparse.Namespace) -> None:
    import uvloop

    from service.adapters.kafka.replay import (
        Replay,
        ReplayReport,
        ReplayStopped,
        Selection,
        replay_dead_letters,
        replay_group,
    )
    from service.adapters.kafka.security import KafkaSecurity
    from service.entrypoints.kafka_settings import kafka_security
    from service.entrypoints.progress import Progress, to_stderr

    embedded = settings.kafka_bootstrap is None
    replay = Replay(
        bootstrap=settings.kafka_bootstrap or f"127.0.0.1:{settings.embedded_kafka_port}",
        dlq_topic=settings.dlq_topic,
        topic=settings.kafka_topic,
        group=replay_group(settings.kafka_group_id, args.reason),
        selection=Selection(args.reason, args.since),
        dry_run=args.dry_run,
        from_beginning=args.from_beginning,
        security=KafkaSecurity() if embedded else kafka_security(settings),
        idempotence=settings.kafka_dlq_idempotence and not embedded,
    )
    ticks = Progress(to_stderr, every=REPLAY_PROGRESS_EVERY)

    def progress(report: ReplayReport) -> None:
        ticks.tick(report.read, lambda: f"dlq replay: {report.line()} so far")

    try:
        report = uvloop.run(replay_dead_letters(replay, None if args.quiet else progress))
    except ReplayStopped as stopped:
        print(json.dumps(stopped.report.as_dict() | {"stopped": str(stopped)}))
        _fail(f"dlq replay stopped ({stopped}) after {stopped.report.line()}; run it again", code=1)
    print(json.dumps(report.as_dict()))
    if not args.quiet:
        to_stderr(f"dlq replay done: {report.line()} ({replay.group})")


# --- `mao-memory settings get | set-model MODEL [--probe]`: the extraction model (D10) -------------


def _add_settings_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    settings_cmd = commands.add_parser(
        "settings",
        help="read or set the extraction model, as the admin page does",
        description="Read or set the extraction model (D10) in the database, with the checks of "
        "PUT /api/v1/admin/memory/settings.",
    ).add_subparsers(dest="settings_command", required=True)
    settings_cmd.add_parser(
        "get",
        help="print the extraction model, the effective one, and the events dead-lettered as "
        "model_rejected since it was set (JSON)",
        description="Print the extraction model, the effective one, and the events dead-lettered as "
        "model_rejected since it was set, as JSON on stdout.",
    )
    set_model = settings_cmd.add_parser(
        "set-model",
        help="set the extraction model; a name litellm maps to no provider is refused (exit 1)",
        description="Set the extraction model. A name litellm maps to no provider, or (with --probe) "
        "a model whose test call fails, is refused in one line on stderr with exit code 1.",
    )
    set_model.add_argument(
        "model", help='a litellm model name, such as openai/gpt-4o-mini; "" for the default'
    )
    set_model.add_argument(
        "--probe", action="store_true", help="make one tiny call to the model first; refuse it if that fails"
    )


def _settings(settings: Settings, args: argparse.Namespace) -> None:
    """Through the same checks as `PUT /api/v1/admin/memory/settings`; the answer is JSON on stdout,
    a refusal one line on stderr. Log lines go to stderr, so stdout stays parseable."""
    import structlog
    import uvloop
    from sqlalchemy.exc import DBAPIError

    from service.app.model_setting import ModelRefused

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        print(json.dumps(uvloop.run(_settings_command(settings, args)), ensure_ascii=False))
    except ModelRefused as exc:
        _fail(str(exc), code=1)
    except DBAPIError as exc:
        _fail(_unreachable(settings.database_url, exc), code=1)


async def _settings_command(settings: Settings, args: argparse.Namespace) -> dict[str, object]:
    import structlog

    from service.adapters.db.database import Database
    from service.adapters.db.engine import build_engine
    from service.adapters.llm_client import LlmClient
    from service.adapters.metrics import Metrics
    from service.app.model_setting import ModelSetting
    from service.entrypoints.http.api_models import ExtractionModelView

    db = Database(build_engine(settings.database_url, 1))
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    llm = LlmClient(
        Metrics(),
        settings.llm_api_base,
        key,
        settings.llm_timeout_s,
        0,
        0.0,
        reasoning_effort=settings.llm_reasoning_effort,
        reasoning_tokens=settings.llm_reasoning_tokens,
        defer_import=True,
    )
    model = ModelSetting(db, llm, settings.default_model, settings.llm_timeout_s)
    try:
        if args.settings_command == "get":
            return ExtractionModelView.of(await model.view())
        previous, view = await model.set(args.model, args.probe)
        structlog.get_logger("mao_memory.audit").info(
            "admin_setting_changed",
            caller="cli",
            setting="memory.extractionModelId",
            old=previous,
            new=args.model,
            probed=args.probe,
        )
        return {"previous": previous, **ExtractionModelView.of(view)}
    finally:
        await llm.stop()
        await db.dispose()


def _eval(settings: Settings, args: argparse.Namespace, root: CompositionRoot) -> None:
    import uvloop

    from service.entrypoints.eval_command import CasesInvalid, comparison_table, load_cases, write_reports
    from service.entrypoints.progress import Progress, to_stderr

    if args.concurrency < 1:
        _fail("--concurrency must be at least 1")
    models: list[str] = args.model or [settings.default_model]
    try:
        cases = load_cases(args.cases)
    except (CasesInvalid, OSError) as exc:
        _fail(f"eval: {exc}")
    updates: dict[str, object] = {"llm_api_base": args.api_base or settings.llm_api_base}
    if args.api_key:
        updates["llm_api_key"] = SecretStr(args.api_key)
    settings = settings.model_copy(update=updates)
    root.configure_logging("ERROR", sys.stderr)  # stdout is the table
    total = len(cases) * len(set(models))
    ticks = Progress(to_stderr, every=max(1, total // 20))

    def progress(done: int, total: int) -> None:
        line = f"eval {_bar(done, total)} {done}/{total} cases"
        if done == total:
            to_stderr(line)
        else:
            ticks.tick(done, lambda: line)

    reports = uvloop.run(
        root.run_eval(settings, models, cases, args.concurrency, None if args.quiet else progress)
    )
    print(comparison_table(reports))
    if args.out is not None:
        write_reports(args.out, reports)


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _with_throwaway_credentials(settings: Settings) -> Settings:
    """`run` on its embedded defaults without credentials: secrets for this process only, and a
    console link that signs in once, so a first look needs no set-up. The link carries a one-time
    code this process exchanges for the token, so the browser's history never holds the token.
    Never when a secret is set, never with a real Kafka, never in `worker` or `api` mode."""
    if settings.jwt_secret is not None or settings.kafka_bootstrap is not None:
        return settings
    from service.entrypoints.http.console_routes import SIGN_IN_CODES
    from service.entrypoints.tokens import mint_token

    updates: dict[str, object] = {"jwt_secret": SecretStr(secrets.token_urlsafe(32))}
    if settings.internal_token is None:
        updates["internal_token"] = SecretStr(secrets.token_urlsafe(24))
    throwaway = settings.model_copy(update=updates)
    token = mint_token(throwaway, DEV_USER, admin=True, lifetime=timedelta(hours=12))
    internal = throwaway.internal_token.get_secret_value() if throwaway.internal_token else ""
    host = "127.0.0.1" if settings.http_host in {"0.0.0.0", "::"} else settings.http_host  # noqa: S104
    console = f"http://{host}:{settings.http_port}/console/#code={SIGN_IN_CODES.issue(token)}"
    print(
        "mao-memory: no MEMORY_JWT_SECRET, so this run uses throwaway credentials (gone at exit):\n"
        f"  console:        {console}  (one sign-in within 10 minutes; later, paste the token below)\n"
        f"  user {DEV_USER} token:   {token}\n"
        f"  internal token: {internal}",
        flush=True,
    )
    return throwaway


def _share_with_dev_token(settings: Settings, run: contextlib.ExitStack) -> None:
    """`mao-memory dev-token` in this directory signs with this run's throwaway secret until it exits."""
    from service.entrypoints import dev_credentials

    assert settings.jwt_secret is not None
    if run.enter_context(dev_credentials.shared(settings.jwt_secret)):
        print(
            "  other users:    mao-memory dev-token --user 42 [--admin], in this directory while this run"
            f" lasts (it reads {dev_credentials.PATH})",
            flush=True,
        )


def _serve(settings: Settings, args: argparse.Namespace, root: CompositionRoot) -> None:
    import uvloop

    from service.adapters.db.engine import SchemaNotCurrent
    from service.adapters.kafka.embedded_broker import PortTaken
    from service.adapters.kafka.security import KafkaConnectionRefused
    from service.entrypoints.process import (
        ConsumerDied,
        EmbeddedBrokerDied,
        ListenerPortTaken,
        Mode,
        serve,
    )

    async def built_and_served(settings: Settings, mode: Mode) -> None:
        # Built in the event loop: aiokafka's clients must be made there.
        await serve(root.build_service(settings, mode))

    mode = Mode(args.command)
    with contextlib.ExitStack() as run:
        if mode is Mode.RUN:
            throwaway = _with_throwaway_credentials(settings)
            if throwaway is not settings:
                _share_with_dev_token(throwaway, run)
            settings = throwaway
        root.configure_logging(settings.log_level)
        try:
            uvloop.run(built_and_served(settings, mode))
        except (SchemaNotCurrent, PortTaken, ListenerPortTaken, KafkaConnectionRefused) as exc:
            _fail(str(exc))
        except (EmbeddedBrokerDied, ConsumerDied) as exc:
            _fail(str(exc), code=1)


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], None]] = {
    "migrate": _migrate,
    "dev-token": _dev_token,
    "dlq": _dlq,
    "settings": _settings,
}
# The commands that build the service from the composition root.
SERVICE_COMMANDS: dict[str, Callable[[Settings, argparse.Namespace, CompositionRoot], None]] = {
    "run": _serve,
    "worker": _serve,
    "api": _serve,
    "retention": _retention,
    "erase-user": _erase_user,
    "eval": _eval,
}


def run(argv: list[str] | None, root: Callable[[], CompositionRoot]) -> None:
    """`root` is called only by the commands that build the service: the others start without
    importing the web, database, Kafka and model stacks."""
    args = _parser().parse_args(argv)
    settings = _load_settings()
    if args.command in SERVICE_COMMANDS:
        SERVICE_COMMANDS[args.command](settings, args, root())
    else:
        COMMANDS[args.command](settings, args)
