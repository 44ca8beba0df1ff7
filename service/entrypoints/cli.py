"""`mao-memory run | worker | api | migrate | retention | erase-user | dev-token | dlq replay`: the
commands, given the composition root by `service.main`, the console script."""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NoReturn, Protocol

from pydantic import SecretStr, ValidationError

from service.config import Settings, dotenv_file

if TYPE_CHECKING:
    from service.app.retention import RetentionReport
    from service.entrypoints.process import Mode, Service

DEV_USER = 1


class CompositionRoot(Protocol):
    """What the commands that run the service take from `service.bootstrap`, the layer above this one."""

    def configure_logging(self, level: str) -> None: ...

    def build_service(self, settings: Settings, mode: Mode) -> Service: ...

    async def run_retention_once(self, settings: Settings) -> RetentionReport: ...

    async def erase_user(self, settings: Settings, user_id: int) -> dict[str, int]: ...


def _load_settings() -> Settings:
    try:
        return Settings(_env_file=dotenv_file())
    except ValidationError as exc:
        lines = [f"  MEMORY_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()]
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
    commands.add_parser("run", help="consumer and HTTP sidecar in one process")
    commands.add_parser("worker", help="the Kafka consumer only (with /healthz, /readyz, /metrics)")
    commands.add_parser("api", help="the HTTP sidecar only")
    commands.add_parser("migrate", help="apply pending schema migrations and exit")
    commands.add_parser(
        "retention",
        help="one retention run now (expired ledger rows, touch runs, old history); prints figures",
    )
    erase = commands.add_parser(
        "erase-user", help="erase everything kept for a user (a closed account); prints rows removed"
    )
    erase.add_argument("user_id", type=int, metavar="USER_ID", help="the user id")
    token = commands.add_parser(
        "dev-token", help="print a JWT for a test user, signed with MEMORY_JWT_SECRET"
    )
    token.add_argument("--user", type=int, required=True, help="the user id (the token's sub)")
    token.add_argument("--admin", action="store_true", help="with memory:read and memory:admin")
    token.add_argument("--hours", type=float, default=12.0, help="lifetime (default 12)")
    dlq = commands.add_parser("dlq", help="the dead-letter topic").add_subparsers(
        dest="dlq_command", required=True
    )
    replay_cmd = dlq.add_parser("replay", help="re-publish dead-lettered events to the main topic")
    replay_cmd.add_argument("--reason", help="only this x-dlq-reason, e.g. model_rejected")
    replay_cmd.add_argument(
        "--since", type=_timestamp, help="only messages dead-lettered at or after this RFC 3339 time"
    )
    replay_cmd.add_argument(
        "--dry-run", action="store_true", help="count what would be replayed, publish nothing"
    )
    return parser


def _migrate(settings: Settings, _: argparse.Namespace) -> None:
    from service.adapters.db.engine import SCHEMA_HEAD, current_revision, upgrade_schema

    before = current_revision(settings.database_url)
    upgrade_schema(settings.database_url)
    head = SCHEMA_HEAD
    if before == head:
        print(f"mao-memory: schema already at revision {head}")
    else:
        print(f"mao-memory: schema migrated from {before or 'nothing'} to revision {head}")


def _retention(settings: Settings, _: argparse.Namespace, root: CompositionRoot) -> None:
    import uvloop

    print(json.dumps(uvloop.run(root.run_retention_once(settings)).as_dict()))


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

    from service.adapters.kafka.replay import Selection, replay_dead_letters

    bootstrap = settings.kafka_bootstrap or f"127.0.0.1:{settings.embedded_kafka_port}"
    selection = Selection(args.reason, args.since)
    report = uvloop.run(
        replay_dead_letters(bootstrap, settings.dlq_topic, settings.kafka_topic, selection, args.dry_run)
    )
    print(report.as_json(args.dry_run))


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
    from service.entrypoints.process import ConsumerDied, EmbeddedBrokerDied, Mode, serve

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
        except (SchemaNotCurrent, PortTaken) as exc:
            _fail(str(exc))
        except (EmbeddedBrokerDied, ConsumerDied) as exc:
            _fail(str(exc), code=1)


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], None]] = {
    "migrate": _migrate,
    "dev-token": _dev_token,
    "dlq": _dlq,
}
# The commands that build the service from the composition root.
SERVICE_COMMANDS: dict[str, Callable[[Settings, argparse.Namespace, CompositionRoot], None]] = {
    "run": _serve,
    "worker": _serve,
    "api": _serve,
    "retention": _retention,
    "erase-user": _erase_user,
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
