"""Which projectKey names a real project (seed 5.6, 7.3): not null, not blank, not a robot channel,
an identifier: no control, format, line-break or invisible character (`key_problem` in
`service/core/normalize.py`).

The robot channels put special values in projectKey: one fixed key per channel (WeChat's
`WEIXIN_PROJECT_KEY`) and, for group chats, per-chat keys under a channel prefix. Neither is a
project: a fact from such a session is stored at USER scope and the key never reaches the project list.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.model import MAX_PROJECT_KEY_CHARS
from service.core.normalize import key_problem, trim


@dataclass(frozen=True, slots=True)
class RobotKeys:
    exact: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def matches(self, key: str) -> bool:
        return key in self.exact or key.startswith(self.prefixes)

    def project(self, key: str | None) -> str | None:
        """The project `key` names, trimmed, or None (null, blank, over the column, a robot channel,
        holding a control, format, line-break or invisible character): the session's facts then go
        to USER scope."""
        if key is None:
            return None
        key = trim(key)
        if key_problem(key, MAX_PROJECT_KEY_CHARS) is not None or self.matches(key):
            return None
        return key
