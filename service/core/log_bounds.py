"""Every text a log line carries is bounded: a record's key, a header, an error's text.

A 4 MB record key once made a 4 MB log line. The bound is applied to every event's values in the log
pipeline (bootstrap's structlog processors), so no call site can forget it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

MAX_LOG_TEXT_BYTES = 256
# Values the pipeline itself renders (a traceback is built after this processor and kept whole).
_KEEP = frozenset({"exc_info", "stack_info", "exception"})


def bounded(text: str | bytes, limit: int = MAX_LOG_TEXT_BYTES) -> str | bytes:
    """`text` cut to `limit` UTF-8 bytes, its full length noted after the cut."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(raw) <= limit:
        return text
    kept = raw[:limit].decode("utf-8", "ignore") if isinstance(text, str) else repr(raw[:limit])
    return f"{kept}… ({len(raw)} bytes)"


def bound_log_values(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: any string or bytes value past the bound is cut, its length noted,
    inside lists, tuples and dicts too; any other object by its `repr` (what the renderer writes)."""
    for name, value in event.items():
        if name not in _KEEP and not isinstance(value, _SCALARS):
            event[name] = _bounded_value(value, _MAX_DEPTH)
    return event


_SCALARS = (int, float, type(None))
_MAX_DEPTH = 6  # deeper (or cyclic) structures are written by their cut `repr`


def _bounded_value(value: Any, depth: int) -> Any:
    if isinstance(value, str | bytes):
        return bounded(value) if len(value) > MAX_LOG_TEXT_BYTES // 4 else value
    if isinstance(value, _SCALARS):
        return value
    if depth > 0 and isinstance(value, Mapping):
        return {_bounded_value(k, 0): _bounded_value(v, depth - 1) for k, v in value.items()}
    if depth > 0 and isinstance(value, list | tuple | set | frozenset):
        return [_bounded_value(v, depth - 1) for v in value]
    text = repr(value)
    return bounded(text) if len(text) > MAX_LOG_TEXT_BYTES // 4 else value
