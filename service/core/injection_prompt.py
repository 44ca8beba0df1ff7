"""The `## 长期记忆` section of the system prompt (seed 5.2), safe against hostile memory content."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from service.core.model import Scope
from service.core.normalize import clean_content, normalize, strip_identifier

HEADING = "## 长期记忆"
PREAMBLE = "以下是关于这位用户与当前项目的已确认记忆;与用户当前消息或工作区规则冲突时,以用户当前消息为准:"


@dataclass(frozen=True, slots=True)
class MemoryHint:
    scope: Scope
    project_key: str | None
    content: str


def one_line(text: str) -> str:
    """Content can only ever be the tail of one list item: no line breaks, no invisible or
    direction-changing characters, no code fence that would swallow the rest of the prompt. Cleaned
    again once the fence is broken: a joiner kept between two backticks then sits beside an
    apostrophe, where it joins nothing."""
    return clean_content(clean_content(text).replace("```", "'''"))


@lru_cache(maxsize=4096)  # a user's few project keys come back on every turn
def key_line(key: str) -> str:
    """A project key as one line of an identifier's characters (a key stored before the identifier
    rule may hold line breaks or invisible characters)."""
    return normalize(strip_identifier(one_line(key)))


def injected(hints: Iterable[MemoryHint]) -> list[MemoryHint]:
    """The hints as the harness gets them in `memories`: the content and the project key as the
    prompt shows them (`one_line`, `key_line`), empty contents dropped."""
    return [
        MemoryHint(hint.scope, hint.project_key and key_line(hint.project_key), content)
        for hint in hints
        if (content := one_line(hint.content))
    ]


def render_injection(hints: Iterable[MemoryHint]) -> str:
    """Empty string when there is nothing to inject, so the harness adds no section at all."""
    return prompt_section(injected(hints))


def prompt_section(shown: list[MemoryHint]) -> str:
    """The section of hints `injected` already made safe: each is made safe once per request."""
    lines = []
    for hint in shown:
        if hint.scope is Scope.PROJECT:
            key = (hint.project_key or "").replace("]", ")")
            lines.append(f"- [项目:{key}] {hint.content}")
        else:
            lines.append(f"- [用户] {hint.content}")
    if not lines:
        return ""
    return "\n".join([HEADING, PREAMBLE, *lines])
