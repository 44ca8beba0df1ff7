"""Structured output: what a model is asked for (`MEMORY_LLM_STRUCTURED_OUTPUT`), the request's
`response_format` for it, and when a failed call may mean the provider refuses the mode."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.adapters.llm_failures import FailureClass, LlmError


class StructuredOutput(StrEnum):
    """`MEMORY_LLM_STRUCTURED_OUTPUT`; `auto` picks json_schema where litellm says the model takes one."""

    AUTO = "auto"
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    OFF = "off"


# The weaker mode to try when a provider refuses one.
WEAKER = {
    StructuredOutput.JSON_SCHEMA: StructuredOutput.JSON_OBJECT,
    StructuredOutput.JSON_OBJECT: StructuredOutput.OFF,
}


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """What the caller asks for: the wrapper object's name and its JSON schema, and a token cap."""

    name: str
    schema: dict[str, Any]
    max_tokens: int


def response_format(mode: StructuredOutput, shape: AnswerShape) -> dict[str, Any] | None:
    """The request's `response_format`; None when structured output is off."""
    if mode is StructuredOutput.OFF:
        return None
    if mode is StructuredOutput.JSON_SCHEMA:
        return {
            "type": "json_schema",
            "json_schema": {"name": shape.name, "strict": True, "schema": shape.schema},
        }
    return {"type": "json_object"}


def refuses_mode(error: LlmError) -> bool:
    """A 4xx may be the mode's fault, and so may a 5xx that outlasted the retries (llama.cpp's
    server answers a JSON schema it cannot take with 500); a timeout or a 429 never is."""
    if error.failure is FailureClass.REJECTED:
        return True
    return error.failure is FailureClass.OUTAGE and error.status is not None and error.status >= 500
