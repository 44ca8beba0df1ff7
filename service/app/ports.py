"""What the handlers need of the world outside: the model, as a protocol, and the values it answers
with. The handlers reach the model through these names, never through the client's module."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from service.adapters.llm_client import LlmAnswer
from service.adapters.llm_failures import FailureClass, LlmError
from service.adapters.structured_output import AnswerShape, StructuredOutput

__all__ = ["AnswerShape", "FailureClass", "Llm", "LlmAnswer", "LlmError", "StructuredOutput"]


class Llm(Protocol):
    def mode(self, model: str) -> StructuredOutput: ...

    async def complete(
        self,
        purpose: str,
        model: str,
        messages: list[dict[str, str]],
        shape: AnswerShape,
        wait: bool = True,
        *,
        caller: Hashable | None = None,
        mode: StructuredOutput | None = None,
    ) -> LlmAnswer: ...


class ModelCheck(Protocol):
    """What setting the extraction model asks of the model client (`LlmClient`)."""

    def provider_problem(self, model: str) -> str | None: ...

    async def probe(self, model: str, timeout_s: float) -> None: ...
