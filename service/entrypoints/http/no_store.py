"""`Cache-Control: no-store` on every answer of `/api/**` and `/internal/**`: a browser would otherwise
keep them in its disk cache, where whoever uses the profile next finds another user's memories, the
admin audit and the sign-in exchange's token after the console signed out."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PRIVATE_PREFIXES = ("/api/", "/internal/")


class NoStore:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PRIVATE_PREFIXES):
            await self.app(scope, receive, send)
            return

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
                message = {**message, "headers": [*headers, (b"cache-control", b"no-store")]}
            await send(message)

        await self.app(scope, receive, send_no_store)
