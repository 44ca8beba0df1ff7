"""The HTTP server: uvicorn on httptools, with the limits a hostile client must meet.

uvicorn bounds none of these by itself. httptools buffers a request head of any size (an
unfinished header value is copied onto itself on every read), `timeout_keep_alive` starts only
after a response, so a connection that never completes its first head stays open, and
`limit_concurrency` is checked only once a head is complete: connections beyond it are accepted and
their heads read, and since it counts the asking connection it serves one fewer than its value. h11
caps an unfinished head (`h11_max_incomplete_event_size`) but answers 400 and counts no headers.
`GuardedHttpTools` adds the limits to the httptools protocol:

- the request line and headers together over `max_bytes`, or more than `max_headers` headers: 431;
- a head not complete within `timeout_s` of the connection opening (or of its first byte, on a
  kept-alive connection): the connection is closed; an idle kept-alive connection is closed after
  `timeout_keep_alive` whatever it trickles (uvicorn's own timer restarts on every byte);
- more than `max_connections` open connections: 503 at once, before anything is read.

A refusal carries the envelope and `Connection: close`; the server then stops sending and drops
what the client still sends for a moment before closing, so the client reads the answer instead of
a reset.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

if TYPE_CHECKING:
    from service.config import Settings

# Longer than clients' and load balancers' idle timeouts (httpx 5 s, ALB 60 s), so the server is
# never the side closing a connection a client is about to reuse.
KEEP_ALIVE_S = 75
# How long a refused connection is drained before it is closed.
LINGER_S = 1.0


@dataclass(frozen=True, slots=True)
class HeadLimits:
    max_bytes: int
    max_headers: int
    timeout_s: float
    max_connections: int


class TooManyHeaders(Exception):
    """Raised inside the parser's header callback: it stops parsing the head at once."""


def _refusal(status: int, code: int, message: str) -> bytes:
    body = json.dumps({"code": code, "message": message, "data": None}).encode()
    head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    return STATUS_LINE[status] + head + body


HEAD_TOO_LARGE = _refusal(431, 43100, "request headers too large")
TOO_MANY_CONNECTIONS = _refusal(503, 50300, "too many connections")


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with `HeadLimits` (module docstring). The limits are a class
    attribute because uvicorn builds each connection's protocol from the class itself."""

    limits: ClassVar[HeadLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_head = True  # bytes received now belong to a request head
        self._head_bytes = 0
        self._header_count = 0
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(TOO_MANY_CONNECTIONS)
        else:
            self._arm(self.limits.timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Checked after parsing, so a small head that arrived with its body is never counted whole;
        # an unfinished head holds at most one read beyond the limit.
        if self._awaiting_head and self._head_bytes > self.limits.max_bytes and not self._closing():
            self._refuse(HEAD_TOO_LARGE)

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a head refused with 431 in on_header ends up here as a parse error
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        self._arm(self.limits.timeout_s)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._refuse(HEAD_TOO_LARGE)
            raise TooManyHeaders
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_head = True

    def on_response_complete(self) -> None:
        idle = not self.pipeline
        super().on_response_complete()
        if idle and not self._closing():
            self._arm(self.timeout_keep_alive)

    def _closing(self) -> bool:
        return self._refused or self.transport.is_closing()

    def _arm(self, delay: float) -> None:
        """Close the connection `delay` from now, unless an earlier close is already due."""
        deadline = self.loop.time() + delay
        if self._timer is not None and self._deadline <= deadline:
            return
        self._disarm()
        self._deadline = deadline
        self._timer = self.loop.call_at(deadline, self.transport.close)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        self._disarm()
        self.connections.discard(self)
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)


def guarded(limits: HeadLimits) -> type[GuardedHttpTools]:
    class Guarded(GuardedHttpTools):
        pass

    Guarded.limits = limits
    return Guarded


def server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The one uvicorn configuration of every mode; logging and signals stay the service's."""
    limits = HeadLimits(
        max_bytes=settings.http_max_header_bytes,
        max_headers=settings.http_max_headers,
        timeout_s=settings.http_head_timeout_s,
        max_connections=settings.http_max_connections,
    )
    return uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        lifespan="off",
        loop="none",
        http=guarded(limits),
        ws="none",  # no WebSocket endpoint: an upgrade request is an ordinary request
        timeout_keep_alive=KEEP_ALIVE_S,
    )
