"""A dead-letter topic in memory: what the processor published, in order."""

from __future__ import annotations

from service.adapters.kafka.dead_letters import REASON, Headers, header


class RecordingDeadLetters:
    def __init__(self) -> None:
        self.published: list[tuple[bytes | None, bytes | None, Headers]] = []

    async def publish(self, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        self.published.append((value, key, headers))

    def reasons(self) -> list[str | None]:
        return [header(headers, REASON) for _value, _key, headers in self.published]
