"""The request schema and the validator agree on what is blank, under Python's and ECMA's regexes."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from service.entrypoints.http.api_models import CreateUserMemory

# ECMA-262's \s: what a JavaScript client or a schema-driven generator treats as whitespace.
ECMA_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
SAMPLES = ["\x1e\x1e", " \x1c\x1d\x1f ", "\x85", "\u3000\u2028", " \t\n", "\ufeff", "a", " 记忆 ", "\x1ex"]
# The stored-text rule: no control or direction character, something visible.
SAMPLES += [
    "a\x00",
    "\x00a",
    "记\u202e忆",
    "\u2066记忆\u2069",
    "\x9b",
    "\u200b\u200b",
    "a\x7f",
    "记忆\u200d\u200b",
]


def _accepted(content: str) -> bool:
    try:
        CreateUserMemory.model_validate({"scope": "USER", "content": content})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("content", SAMPLES)
def test_schema_pattern_matches_the_validator(content: str) -> None:
    pattern = CreateUserMemory.model_json_schema(by_alias=True)["properties"]["content"]["pattern"]
    python_match = re.search(pattern, content) is not None
    ecma_pattern = pattern.replace(r"\S", f"[^{ECMA_SPACE}]").replace(r"\s", ECMA_SPACE)
    ecma_match = re.search(ecma_pattern, content) is not None
    accepted = _accepted(content)
    # A string the schema calls valid must be accepted, whichever regex dialect reads the schema.
    assert python_match == accepted
    assert not ecma_match or accepted
