"""The HTTP server: uvicorn on httptools, with the limits a hostile client must meet.

uvicorn bounds none of these by itself. httptools buffers a request head of any size (an
unfinished header value is copied onto itself on every read) and hands chunked trailer fields to
the same callback as headers, which uvicorn appends to the request's headers. `timeout_keep_alive`
starts only after a response, so a connection that never completes its first head, or its body,
stays open; nothing times a client that does not read its answers; pipelined requests queue without
end. `limit_concurrency` is checked only once a head is complete: connections beyond it are
accepted and their heads read, and since it counts the asking connection it serves one fewer than
its value. h11 caps an unfinished head (`h11_max_incomplete_event_size`) but answers 400 and counts
no headers. `GuardedHttpTools` adds the limits to the httptools protocol:

- the request line and headers together over `max_head_bytes`, or more than `max_headers` headers:
  431, counted as the parser delivers them and, for a head still arriving, as its bytes arrive;
- a head not complete within `head_timeout_s` of the connection opening (or of its first byte, on a
  kept-alive connection): the connection is closed; an idle kept-alive connection is closed after
  `timeout_keep_alive` whatever it trickles (uvicorn's own timer restarts on every byte);
- a body not complete within `body_timeout_s` of its head: 408; a message (body, chunk framing and
  trailers) over `max_message_bytes`: 413. Either way the connection is closed;
- trailer fields are dropped, never merged into the headers (RFC 9110 6.5.1): a credential or a
  content type sent only after the body must not count;
- a connection whose answers the client has left unread for `send_timeout_s` (the transport's buffer
  full all that time) is dropped;
- more than `PIPELINE_DEPTH` requests waiting behind the one being answered: the rest is not read,
  and once the waiting ones are answered the connection gets 503 and is closed;
- more than `max_connections` open connections, or more than `max_connections_per_client` from one
  client (an IPv4 address, or an IPv6 /64: `client_key`): 503 at once, before anything is read. A
  client's connections otherwise idle on keep-alive for `KEEP_ALIVE_S`, so without the second bound
  one client holding every slot (one request each, then nothing) would starve every other client
  for as long as it likes.

A refusal carries the envelope and `Connection: close`, after every earlier request's answer; the
server then stops sending and drops what the client still sends for a moment before closing, so the
client reads the answer instead of a reset (what is still buffered for it gets the send timeout).
Behind a proxy that opens the connections itself, every connection comes from the proxy's address:
there the per-address bound is the proxy's share, and is set to `max_connections` to turn it off.

The ops listener (`ops_server_config`) serves `/healthz`, `/readyz` and `/metrics` alone, on a port
of its own with slots of its own, so that a full API never answers an orchestrator's probe 503.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.entrypoints.http.body_limit import MAX_BODY_BYTES

if TYPE_CHECKING:
    from service.config import Settings

# Longer than clients' and load balancers' idle timeouts (httpx 5 s, ALB 60 s), so the server is
# never the side closing a connection a client is about to reuse.
KEEP_ALIVE_S = 75
# How long a refused connection is drained before it is closed.
LINGER_S = 1.0
# Requests parsed and waiting while an earlier one on the same connection is answered. Browsers do
# not pipeline; each waiting request holds its scope and body.
PIPELINE_DEPTH = 8
# The ops listener's slots: probes (one connection each, closed after) and a scraper or two.
OPS_MAX_CONNECTIONS = 32
OPS_MAX_CONNECTIONS_PER_CLIENT = 8
# Chunk framing allowed on top of a body: as much again, which chunks of 5 bytes or more stay within.
FRAMING_BYTES = MAX_BODY_BYTES


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_head_bytes: int
    max_headers: int
    head_timeout_s: float
    body_timeout_s: float
    send_timeout_s: float
    max_connections: int
    max_connections_per_client: int

    @property
    def max_message_bytes(self) -> int:
        """Everything after a head that a request may send: the largest body the application
        reads, its chunk framing, and trailers as large as a head."""
        return MAX_BODY_BYTES + FRAMING_BYTES + self.max_head_bytes


class HeadTooLarge(Exception):
    """Raised inside a parser callback: it stops parsing at once."""


class PipelineFull(Exception):
    """Raised inside the parser's head callback: nothing after this request is parsed."""


def _refusal(status: int, code: int, message: str) -> bytes:
    body = json.dumps({"code": code, "message": message, "data": None}).encode()
    head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    return STATUS_LINE[status] + head + body


HEAD_TOO_LARGE = _refusal(431, 43100, "request headers too large")
BODY_TIMEOUT = _refusal(408, 40800, "request body not received in time")
MESSAGE_TOO_LARGE = _refusal(413, 41300, "request body too large")
TOO_MANY_CONNECTIONS = _refusal(503, 50300, "too many connections")
TOO_MANY_FROM_CLIENT = _refusal(503, 50300, "too many connections from this address")
TOO_MANY_PIPELINED = _refusal(503, 50300, "too many pipelined requests")


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with `HttpLimits` (module docstring). The limits, and the open
    connections per client address, are class attributes because uvicorn builds each connection's
    protocol from the class itself (`guarded` makes one class per server)."""

    limits: ClassVar[HttpLimits]
    per_client: ClassVar[dict[str, int]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the parser is reading a request head, or waiting for one
        self._received = 0  # bytes received of the current head, or of the current message after it
        self._head_bytes = 0  # the current head's line and headers, as the parser delivers them
        self._header_count = 0
        self._refused = False
        self._pending: bytes | None = None  # a refusal waiting for earlier requests' answers
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._send_timer: asyncio.TimerHandle | None = None
        self._address: str | None = None  # counted in `per_client` while set

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = client_key(self.client[0] if self.client else "")
        if len(self.connections) > self.limits.max_connections:
            self._refuse(TOO_MANY_CONNECTIONS)
        elif self.per_client.get(address, 0) >= self.limits.max_connections_per_client:
            self._refuse(TOO_MANY_FROM_CLIENT)
        else:
            self.per_client[address] = self.per_client.get(address, 0) + 1
            self._address = address
            self._arm(self.limits.head_timeout_s, self._drop)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_send_timer()
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._pending is not None:
            self.flow.pause_reading()  # uvicorn resumes reading whenever it starts the next request
            return
        self._received += len(data)
        super().data_received(data)
        # Checked after parsing, so a small head that arrived with its body is never counted whole,
        # and the counts restart where the parser found a head or a body to end: an unfinished one
        # holds at most one read beyond its limit.
        if self._refused or self._pending is not None or self.transport.is_closing():
            return
        if self._in_head and self._received > self.limits.max_head_bytes:
            self._refuse_in_turn(HEAD_TOO_LARGE)
        elif not self._in_head and self._received > self.limits.max_message_bytes:
            self._refuse_in_turn(MESSAGE_TOO_LARGE)

    def send_400_response(self, msg: str) -> None:
        # A head refused in a parser callback ends up here as a parse error.
        if not self._refused and self._pending is None:
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._received = self._head_bytes = self._header_count = 0
        self._arm(self.limits.head_timeout_s, self._drop)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer field
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._refuse_in_turn(HEAD_TOO_LARGE)
            raise HeadTooLarge
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if len(self.pipeline) >= PIPELINE_DEPTH:
            self._refuse_in_turn(TOO_MANY_PIPELINED)
            raise PipelineFull
        self._in_head = False
        self._received = 0
        self._disarm()
        self._arm(self.limits.body_timeout_s, lambda: self._refuse_in_turn(BODY_TIMEOUT))
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._received = 0
        self._disarm()
        if self.cycle.response_complete and not self.pipeline:  # answered before its body ended
            self._arm(self.timeout_keep_alive, self._drop)

    def on_response_complete(self) -> None:
        idle = not self.pipeline
        super().on_response_complete()
        if not idle or self._refused or self.transport.is_closing():
            return
        if self._pending is not None:
            self._refuse(self._pending)
        elif self._in_head:
            self._arm(self.timeout_keep_alive, self._drop)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._drop)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.limits.max_head_bytes:
            self._refuse_in_turn(HEAD_TOO_LARGE)
            raise HeadTooLarge

    def _arm(self, delay: float, expire: Callable[[], None]) -> None:
        """Call `expire` `delay` from now, unless an earlier expiry is already due."""
        deadline = self.loop.time() + delay
        if self._timer is not None and self._deadline <= deadline:
            return
        self._disarm()
        self._deadline = deadline
        self._timer = self.loop.call_at(deadline, expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _drop(self) -> None:
        """Close at once, discarding what the client has not read: waiting for it to drain would
        wait on the client."""
        self.transport.abort()

    def _refuse_in_turn(self, response: bytes) -> None:
        """Refuse the request being read, after every earlier request's answer. A request whose
        head is complete is cancelled: its application sees a disconnect, and the refusal is written
        only if no answer to it has started."""
        self._disarm()
        current = None if self._in_head else self.cycle
        if current is not None and self.pipeline and self.pipeline[0][0] is current:
            self.pipeline.popleft()  # still waiting: it never runs
        elif current is not None:
            if current.response_started:
                response = b""
            current.disconnected = True
            current.message_event.set()
            self._refuse(response)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._pending = response
            self.flow.pause_reading()
        else:
            self._refuse(response)

    def _release(self) -> None:
        """Give the connection's slot back to its address: at its refusal or its end, once."""
        address, self._address = self._address, None
        if address is not None:
            left = self.per_client[address] - 1
            if left:
                self.per_client[address] = left
            else:
                del self.per_client[address]

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        self._pending = None
        self._disarm()
        self.connections.discard(self)
        self._release()
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()  # drained until closed
        self._timer = self.loop.call_later(LINGER_S, self._close)

    def _close(self) -> None:
        """Close once the answers still buffered are sent (a slow reader still gets them), or drop
        them if that takes longer than the send timeout."""
        self.transport.close()
        self._timer = self.loop.call_later(self.limits.send_timeout_s, self._drop)


def client_key(address: str) -> str:
    """The client an address counts as: an IPv6 address as its /64, the least a host or a home line
    is given (each of its 2^64 addresses a client of its own would leave the bound without effect),
    and an IPv4-mapped address as the IPv4 address it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return address


def guarded(limits: HttpLimits) -> type[GuardedHttpTools]:
    class Guarded(GuardedHttpTools):
        pass

    Guarded.limits = limits
    Guarded.per_client = {}
    return Guarded


def server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The API's uvicorn configuration, in every mode; logging and signals stay the service's."""
    limits = _limits(settings, settings.http_max_connections, settings.http_max_connections_per_client)
    return _config(app, settings.http_host, settings.http_port, limits)


def ops_server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The ops listener's: the same limits on a request, few slots of its own."""
    limits = _limits(settings, OPS_MAX_CONNECTIONS, OPS_MAX_CONNECTIONS_PER_CLIENT)
    return _config(app, settings.http_host, settings.ops_port, limits)


def _limits(settings: Settings, max_connections: int, per_client: int) -> HttpLimits:
    return HttpLimits(
        max_head_bytes=settings.http_max_header_bytes,
        max_headers=settings.http_max_headers,
        head_timeout_s=settings.http_head_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        send_timeout_s=settings.http_send_timeout_s,
        max_connections=max_connections,
        max_connections_per_client=per_client,
    )


def _config(app: Any, host: str, port: int, limits: HttpLimits) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        loop="none",
        http=guarded(limits),
        ws="none",  # no WebSocket endpoint: an upgrade request is an ordinary request
        timeout_keep_alive=KEEP_ALIVE_S,
        # X-Forwarded-For and -Proto from a client would be believed (uvicorn trusts 127.0.0.1 by
        # default); nothing here reads the client's address or scheme.
        proxy_headers=False,
    )
