"""Which database errors are worth waiting out, decided by error code rather than exception class.

A transient error says the database is not usable right now, not that the statement is wrong: the
connection went away or cannot be made, the credentials or grants are being rotated (a wrong or
expired password, a locked account, an account set up for another login method), the database is
not there yet, a Galera node has lost its cluster, a lock or a deadlock, a statement timeout (a KILL
QUERY by a watchdog is the same thing), the server is read-only during a failover, overloaded, out
of resources or shutting down. The consumer waits those out with the offset held, and the API
answers 503. Only an error about the statement's own content (unknown column, missing table, data
too long, a syntax error, an unexpected duplicate key) is a bug or bad data, and goes through the
three tries and the DLQ, so it can never wedge a partition. pymysql and asyncmy both raise the
server's (or client's) numeric code as `args[0]`; the SQLite driver carries `sqlite_errorcode`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# MySQL/MariaDB codes. 1xxx come from the server, 2xxx from the client library.
MYSQL_TRANSIENT: dict[int, str] = {
    1021: "disk full",
    1037: "server out of memory",
    1040: "too many connections",
    1041: "server out of resources",
    1044: "access denied to the database (grants being changed)",
    1045: "access denied (credential rotation)",
    # Also "unknown command", which only a broken driver causes, never a statement's content.
    1047: "Galera node not prepared for application use (out of its cluster)",
    1049: "unknown database (not created or restored yet)",
    1053: "server shutdown in progress",
    1114: "table full (disk or tablespace)",
    1129: "host blocked after connection errors",
    1130: "host not allowed to connect",
    1135: "server cannot create a thread",
    1142: "command denied on a table (grants being changed)",
    1143: "command denied on a column (grants being changed)",
    1158: "network read error",
    1159: "network read timeout",
    1160: "network write error",
    1161: "network write timeout",
    1203: "user's connection limit reached",
    1205: "lock wait timeout",
    1213: "deadlock",
    1226: "user's resource limit reached",
    1290: "server runs with --read-only (failover)",
    1317: "query interrupted (KILL QUERY)",
    1614: "XA transaction rolled back for a deadlock",
    1637: "too many active concurrent transactions",
    1698: "access denied to an account authenticated another way (unix_socket over TCP)",
    1792: "read-only transaction",
    1820: "password expired: the session may only reset it (sandbox mode)",
    1836: "read-only mode",
    1862: "password expired: login refused (disconnect_on_expired_password)",
    1927: "connection killed (MariaDB)",
    1969: "statement timeout (MariaDB max_statement_time)",
    2002: "cannot connect (socket)",
    2003: "cannot connect (TCP)",
    2005: "unknown server host (DNS)",
    2006: "server has gone away",
    2013: "lost connection during query",
    2055: "lost connection (system error)",
    3024: "statement timeout (MySQL max_execution_time)",
    3032: "server in offline mode (MySQL)",
    3118: "account locked (MySQL)",
    4031: "disconnected by the server for inactivity",
    4151: "account locked (MariaDB)",
}

# SQLite primary result codes (the low byte of the extended code).
SQLITE_TRANSIENT: dict[int, str] = {
    5: "SQLITE_BUSY: database is locked",
    6: "SQLITE_LOCKED: table is locked",
    10: "SQLITE_IOERR: disk I/O error",
    13: "SQLITE_FULL: disk full",
    14: "SQLITE_CANTOPEN: cannot open the database file",
}


def error_code(exc: BaseException) -> tuple[str, int] | None:
    """("mysql" | "sqlite", code) of the driver error SQLAlchemy wrapped in `exc`, if any."""
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    sqlite_code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int):
        return "sqlite", sqlite_code & 0xFF
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return "mysql", args[0]
    return None


# A session the server will not serve again, though the connection is up: opened while the account's
# password was expired, it answers 1820 to everything until it is closed, even after the reset.
SESSION_UNUSABLE = frozenset({1820})


def retires_connection(dialect: Any, error: BaseException) -> bool:
    """The connection must leave the pool: the dialect's disconnects, and sessions the server refuses.
    `error` is the driver's own exception."""
    if dialect.is_disconnect(error, None, None):
        return True
    args: tuple[object, ...] = getattr(error, "args", ())
    return dialect.name == "mysql" and bool(args) and args[0] in SESSION_UNUSABLE


class TextRuleChanged(Exception):
    """The database's hashes follow another text rule than this code's: during a rolling update a
    newer release migrated it. Writing now would store hashes the new rule does not find, so this
    process writes nothing (transient: the consumer holds its offsets, the API answers 503) until it
    is replaced."""

    def __init__(self, found: str | None, wanted: str) -> None:
        super().__init__(
            f"the database's text rule is version {found or 'unrecorded'}, this code writes version"
            f" {wanted}: no memory is written until a release of rule {found or wanted} runs"
        )
        self.found = found
        self.wanted = wanted


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, PoolTimeout | ConnectionError | OSError | TextRuleChanged):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True  # SQLAlchemy recognized a disconnect (it also knows pymysql's codeless "(0, '')")
    code = error_code(exc)
    if code is None:
        return False
    dialect, number = code
    return number in (SQLITE_TRANSIENT if dialect == "sqlite" else MYSQL_TRANSIENT)
