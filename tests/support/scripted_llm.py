"""A scripted chat server on loopback for the real litellm path: OpenAI's chat completions, and
Anthropic's messages API on `…/messages` (a provider with another wire format).

Rules match a substring of the request's messages; the first matching rule answers. Every request
is recorded with its raw bytes, so tests can assert how many calls were made, what the prompt
contained, and exactly what went over the wire.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.prompt_data import prompt_data


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: a burst of new connections from several clients
    # overflows it, and each dropped SYN costs the client 1 s, 3 s, 7 s... before it retries.
    request_queue_size = 1024


@dataclass
class Rule:
    marker: str
    reply: str = "[]"
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    times: int | None = None  # answer this many times, then fall through to later rules
    raw_body: bytes | None = None  # sent as-is instead of a chat completion (broken answers)
    truncate: bool = False  # announce the whole body, send half of it, close: a stream cut mid-answer
    reset: bool = False  # read the request, answer nothing, reset the connection
    drip_s: float = 0.0  # send the body one byte at a time, this long apart: no read ever times out
    finish_reason: str = "stop"  # "length": the answer hit the token cap (Anthropic: "max_tokens")
    only_if: Callable[[Request], bool] | None = None  # answers only the requests this accepts


@dataclass
class Request:
    model: str
    messages: list[dict[str, Any]]
    at: float
    body: dict[str, Any] = field(default_factory=dict)  # the whole request: response_format, max_tokens…
    raw: bytes = b""
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased

    @property
    def text(self) -> str:
        system = self.body.get("system")  # Anthropic puts the system prompt beside the messages
        parts = [str(system)] if system else []
        return "\n".join(parts + [str(m.get("content", "")) for m in self.messages])

    @property
    def data(self) -> dict[str, Any]:
        """The data of an extraction or consolidation prompt's user message (`prompt_data`)."""
        return prompt_data(str(self.messages[-1]["content"]))


class _FifoSlot:
    """One request at a time, granted in arrival order, as llama.cpp's server queues its tasks
    (`threading.Lock` grants in no particular order)."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._issued = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._turn:
            ticket = self._issued
            self._issued += 1
            self._turn.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *_exc: object) -> None:
        with self._turn:
            self._serving += 1
            self._turn.notify_all()


class ScriptedLlm:
    def __init__(self, record: bool = True, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._record = record  # off for long runs: every prompt kept would fill the memory
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.default_delay_s = 0.0
        # One request at a time, the others queued (a local server with one slot, llama.cpp's default).
        self.single_slot = False
        self._slot = _FifoSlot()
        # Answers requests no rule matches: a function of the request, for streams of many events.
        self.responder: Callable[[Request], str | None] | None = None
        self._server = _Server(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ScriptedLlm:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def reset(self) -> None:
        with self._lock:
            self.rules.clear()
            self.requests.clear()
            self.default_delay_s = 0.0
            self.single_slot = False
            self.responder = None

    def script(self, marker: str, reply: Any = "[]", **kwargs: Any) -> Rule:
        text = reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False)
        rule = Rule(marker=marker, reply=text, **kwargs)
        with self._lock:
            self.rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            self.rules.remove(rule)

    def calls(self, marker: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if marker in r.text]

    def _answer(
        self, body: dict[str, Any], raw: bytes, path: str, headers: dict[str, str]
    ) -> tuple[Rule | None, Request]:
        request = Request(
            model=str(body.get("model")),
            messages=list(body.get("messages", [])),
            at=time.time(),
            body=body,
            raw=raw,
            path=path,
            headers=headers,
        )
        with self._lock:
            if self._record:
                self.requests.append(request)
            for rule in self.rules:
                if rule.only_if is not None and not rule.only_if(request):
                    continue
                if rule.marker in request.text and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule, request
        return None, request

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as two writes; with Nagle on, the client's delayed ACK adds
            # 40 ms to every answer.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                if llm.single_slot:
                    with llm._slot:
                        self._post()
                else:
                    self._post()

            def _post(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                rule, request = llm._answer(json.loads(raw or b"{}"), raw, self.path, headers)
                delay = rule.delay_s if rule and rule.delay_s else llm.default_delay_s
                if delay:
                    time.sleep(delay)
                if rule is not None and rule.reset:
                    # SO_LINGER 0: close() sends RST instead of FIN.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                status = rule.status if rule else 200
                if rule is not None and rule.raw_body is not None:
                    payload = rule.raw_body
                elif status != 200:
                    payload = json.dumps(
                        {"error": {"message": "scripted failure", "type": "server_error"}}
                    ).encode()
                else:
                    reply = rule.reply if rule else (llm.responder(request) if llm.responder else None)
                    answer = _message if self.path.endswith("/messages") else _completion
                    finish = rule.finish_reason if rule else "stop"
                    payload = json.dumps(answer(request.model, reply or "[]", finish)).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in (rule.headers if rule else {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    if rule is not None and rule.truncate:
                        self.wfile.write(payload[: len(payload) // 2])
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    if rule is not None and rule.drip_s:
                        for byte in payload:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(rule.drip_s)
                        return
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


def _completion(model: str, content: str, finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


def _message(model: str, content: str, finish_reason: str = "stop") -> dict[str, Any]:
    """Anthropic's messages API answer."""
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": content}],
        "stop_reason": "max_tokens" if finish_reason == "length" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }
