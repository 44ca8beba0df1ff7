"""A real model client whose answer arrives after something else happened: the race between a model
call and a concurrent change, made deterministic."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable

from service.adapters.llm_client import AnswerShape, LlmAnswer, LlmClient, StructuredOutput


class AnswerAfter:
    """Runs `meanwhile` once the model has answered, before the caller sees the answer; only for calls
    of `purpose` when one is given."""

    def __init__(
        self, llm: LlmClient, meanwhile: Callable[[], Awaitable[None]], purpose: str | None = None
    ) -> None:
        self._llm = llm
        self._meanwhile = meanwhile
        self._purpose = purpose

    def mode(self, model: str) -> StructuredOutput:
        return self._llm.mode(model)

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
    ) -> LlmAnswer:
        answer = await self._llm.complete(purpose, model, messages, shape, wait, caller=caller, mode=mode)
        if self._purpose is None or purpose == self._purpose:
            await self._meanwhile()
        return answer
