"""litellm's request building for OpenAI's chat format, without `acompletion`'s per-call machinery,
and the call's parameters as litellm maps them for any model.

`litellm.acompletion` spends several milliseconds of CPU per call on things this service does not
use (logging objects, cost bookkeeping, callback dispatch, a thread-pool hop). For a model that
litellm serves with its `openai` provider (OpenAI itself and every OpenAI-compatible server named
`openai/<model>` with an API base), the same request is built here from litellm's own pieces:
provider routing (`get_llm_provider`), parameter mapping (`get_optional_params`), the provider
config's URL, headers and `transform_request`, and the headers the OpenAI SDK derives from the
configuration (organization, project, `litellm.headers`). A configuration this path does not
reproduce (no static API key, custom SDK headers, a proxy, relaxed TLS, litellm's experimental
handler, provider config defaults) sends the model through `acompletion`, and so do models of other
providers (Anthropic, Bedrock, Vertex, Gemini, …), whose wire formats litellm translates.

These are litellm interfaces outside its documented API: the version range is pinned in
pyproject.toml and `tests/unit/test_litellm_requests.py` fails loudly when an upgrade changes them.
"""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from service.core.extraction_prompt import CHANGES
from service.core.prompt_blocks import BLOCK_BREAK

# Providers that cache a prompt prefix only where the request marks it (`cache_control`); OpenAI and
# the OpenAI-compatible servers cache the longest prefix on their own.
MARKED_CACHE_PROVIDERS = frozenset({"anthropic"})
_EPHEMERAL = {"type": "ephemeral"}
# Where an extraction's log of changes starts (`core/prompt_layout.py`): no content holds a line break.
_LOG = BLOCK_BREAK + CHANGES + "\n"
# Providers whose chat requests litellm sends through the OpenAI SDK as this module builds them.
FAST_PROVIDERS = frozenset({"openai"})
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"
# The order in which a reasoning model's effort levels cost less.
EFFORT_LEVELS = ("none", "minimal", "low", "medium", "high")


@dataclass(frozen=True, slots=True)
class Reply:
    """A 2xx read: its text (None: no usable message, `problem` says why) and token counts."""

    text: str | None
    usage: tuple[int, int] | None
    truncated: bool = False
    problem: str = ""
    cache: tuple[int, int] = (0, 0)  # prompt tokens read from, and written to, the provider's prompt cache


@dataclass(frozen=True, slots=True)
class ChatEndpoint:
    """A model resolved once: where its requests go, with which headers, built by which config."""

    model: str  # as the provider names it
    provider: str
    url: str
    headers: dict[str, str]
    config: Any

    def params(self, litellm: Any, call: dict[str, Any]) -> dict[str, Any]:
        """litellm's mapping of the call's parameters (`model_params` plus a response format) for
        this provider; the same for every call of a (mode, token cap), so the client keeps it."""
        mapped = litellm.get_optional_params(model=self.model, custom_llm_provider=self.provider, **call)
        # The OpenAI SDK sends neither a non-streaming flag nor an empty extra body.
        if mapped.get("stream") is False:
            del mapped["stream"]
        if not mapped.get("extra_body"):
            mapped.pop("extra_body", None)
        return dict(mapped)

    def body(self, messages: list[dict[str, str]], params: dict[str, Any]) -> bytes:
        return orjson.dumps(self._request(messages, params))

    def template(self, roles: tuple[str, ...], params: dict[str, Any]) -> BodyTemplate | None:
        """The request of every call with these roles and parameters, its texts left as slots; None
        unless litellm passes texts through untouched: two probes of distinct texts must come back
        with each text in its place and everything else the same."""
        probes = [[{"role": r, "content": f"\x00probe {n}.{i}"} for i, r in enumerate(roles)] for n in (1, 2)]
        built = [self._request(probe, params) for probe in probes]
        shapes: list[list[tuple[tuple[str, ...], str]]] = []
        for request, probe in zip(built, probes, strict=True):
            messages = request.get("messages")
            if not isinstance(messages, list) or len(messages) != len(probe):
                return None
            shape = []
            for message, asked in zip(messages, probe, strict=True):
                if not isinstance(message, dict) or message.keys() != {"role", "content"}:
                    return None
                if message["content"] != asked["content"]:
                    return None
                shape.append((tuple(message), message["role"]))
            shapes.append(shape)
        heads = [{k: v for k, v in request.items() if k != "messages"} for request in built]
        if shapes[0] != shapes[1] or heads[0] != heads[1]:
            return None
        return BodyTemplate(
            {k: None if k == "messages" else v for k, v in built[0].items()}, tuple(shapes[0])
        )

    def _request(self, messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        request: dict[str, Any] = self.config.transform_request(
            model=self.model, messages=messages, optional_params=dict(params), litellm_params={}, headers={}
        )
        return request


@dataclass(frozen=True, slots=True)
class BodyTemplate:
    """litellm's request for one shape of call, the texts aside (`ChatEndpoint.template`): a call
    then pays one JSON encoding instead of litellm's per-message transforms."""

    request: dict[str, Any]  # "messages" a placeholder, in the place litellm puts them
    # Per message: its keys in litellm's order, and its role as litellm sends it (it may rename one).
    messages: tuple[tuple[tuple[str, ...], str], ...]

    def body(self, messages: list[dict[str, str]]) -> bytes:
        sent = [
            {key: role if key == "role" else message["content"] for key in keys}
            for (keys, role), message in zip(self.messages, messages, strict=True)
        ]
        return orjson.dumps({k: sent if k == "messages" else v for k, v in self.request.items()})


def cache_marked(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The messages with their stable prefixes marked for the provider's prompt cache: the system
    rules, and in the last user message the end of its first block (an extraction's USER memories,
    which a user's projects share while no USER row is added), the end of the blocks before a log of
    changes (frozen while the log grows) and the end of the blocks before the last (an extraction's
    conversation). Anthropic writes a prefix at each mark and reads the longest one written before
    at a part's end, so a call that only appended to the log reads the frozen blocks. At most the
    four marks Anthropic takes; a prefix shorter than the model's minimum is simply not cached."""
    marked: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        text = message["content"]
        last = text.rfind(BLOCK_BREAK) if i == len(messages) - 1 and message["role"] == "user" else -1
        if message["role"] == "system":
            marked.append({"role": "system", "content": [_marked(text)]})
        elif last > 0:
            cuts = sorted({text.find(BLOCK_BREAK), text.find(_LOG), last} - {-1, 0})
            parts = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            marked.append(
                {"role": "user", "content": [*map(_marked, parts[:-1]), {"type": "text", "text": parts[-1]}]}
            )
        else:
            marked.append(dict(message))
    return marked


def _marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": _EPHEMERAL}


def model_params(
    litellm: Any, model: str, answer_tokens: int, effort: str | None, reasoning_tokens: int
) -> dict[str, Any]:
    """The call's parameters before litellm maps them, the same on both paths. A model that reasons
    on every call (litellm's mapping will not send it temperature 0: gpt-5, gpt-5-mini, the
    o-series) gets a reasoning effort (`effort`, else the lowest it takes). Every model litellm's
    map marks `supports_reasoning` gets `reasoning_tokens` more room, since hidden reasoning is spent
    inside the completion budget (never beyond the model's own output limit): the map cannot tell
    the models that think by default (Gemini 2.5) from those that think only when asked (Claude),
    and room left unused costs nothing. A parameter the model does not take is dropped by litellm
    (`drop_params`), and litellm sends the budget as `max_completion_tokens` where the model wants it."""
    plain: dict[str, Any] = {"temperature": 0, "max_tokens": answer_tokens, "drop_params": True}
    name, provider, _, _ = litellm.get_llm_provider(model=model)
    row = _model_row(litellm, name, provider)
    budget = answer_tokens + reasoning_tokens
    roomy = plain | {"max_tokens": min(budget, row.get("max_output_tokens") or budget)}
    reasons = bool(row.get("supports_reasoning"))
    if "reasoning_effort" not in (
        litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or []
    ):
        return roomy if reasons else plain
    probe = litellm.get_optional_params(
        model=name, custom_llm_provider=provider, temperature=0, drop_params=True
    )
    if "temperature" in probe:
        return roomy if reasons else plain  # no effort: Claude's thinking, gpt-5.1's, stay off
    return roomy | {"reasoning_effort": effort or lowest_effort(row)}


def _model_row(litellm: Any, name: str, provider: str) -> dict[str, Any]:
    try:
        return dict(litellm.get_model_info(model=name, custom_llm_provider=provider))
    except Exception:
        return {}  # a model outside litellm's map


def lowest_effort(row: dict[str, Any]) -> str:
    """The cheapest effort a model's row of litellm's map says it takes: its listed levels, else
    "none" or "minimal" where flagged (gpt-5.1 on, gpt-5), else "low", which every reasoning model
    OpenAI serves takes."""
    levels = row.get("reasoning_effort_levels")
    if levels:
        return str(
            min(levels, key=lambda level: EFFORT_LEVELS.index(level) if level in EFFORT_LEVELS else 99)
        )
    for level in ("none", "minimal"):
        if row.get(f"supports_{level}_reasoning_effort"):
            return level
    return "low"


def chat_endpoint(litellm: Any, model: str, api_base: str | None, api_key: str | None) -> ChatEndpoint | None:
    """The endpoint of `model` if litellm speaks OpenAI's chat format to it and this path reproduces
    the configuration; None otherwise (the call goes through `acompletion`)."""
    from litellm.types.utils import LlmProviders
    from litellm.utils import ProviderConfigManager

    name, provider, dynamic_key, resolved_base = litellm.get_llm_provider(
        model=model, api_base=api_base, api_key=api_key
    )
    if provider not in FAST_PROVIDERS:
        return None
    # The defaults `acompletion` applies for the openai provider, in its order.
    base = (
        resolved_base
        or litellm.api_base
        or litellm.get_secret("OPENAI_BASE_URL")
        or litellm.get_secret("OPENAI_API_BASE")
        or OPENAI_DEFAULT_BASE
    )
    key = (
        dynamic_key
        or api_key
        or litellm.api_key
        or litellm.openai_key
        or litellm.get_secret("OPENAI_API_KEY")
    )
    config = ProviderConfigManager.get_provider_chat_config(model=name, provider=LlmProviders(provider))
    if config is None or not key or not _covered(litellm, base):
        return None
    params: dict[str, Any] = {}
    headers = config.validate_environment(
        headers={},
        model=name,
        messages=[],
        optional_params=params,
        litellm_params={},
        api_key=key,
        api_base=base,
    )
    url = config.get_complete_url(
        api_base=base, api_key=key, model=name, optional_params=params, litellm_params={}, stream=False
    )
    return ChatEndpoint(name, provider, url, sdk_headers(litellm, dict(headers)), config)


def sdk_headers(litellm: Any, headers: dict[str, str]) -> dict[str, str]:
    """What the OpenAI SDK adds for litellm: JSON accepted, the organization (litellm's setting,
    OPENAI_ORGANIZATION, then the SDK's OPENAI_ORG_ID), the project (OPENAI_PROJECT_ID), and
    `litellm.headers` last, overriding any of the same name."""
    sent = {"Accept": "application/json", **headers}
    organization = (
        litellm.organization or litellm.get_secret("OPENAI_ORGANIZATION") or os.environ.get("OPENAI_ORG_ID")
    )
    project = os.environ.get("OPENAI_PROJECT_ID")
    for header, value in (("OpenAI-Organization", organization), ("OpenAI-Project", project)):
        if value is not None:
            sent[header] = str(value)
    for header, value in (litellm.headers or {}).items():
        sent = {k: v for k, v in sent.items() if k.lower() != str(header).lower()}
        sent[str(header)] = str(value)
    return sent


def _covered(litellm: Any, base: str) -> bool:
    """False when the configuration asks for something only litellm's own client does: headers
    from OPENAI_CUSTOM_HEADERS, its experimental HTTP handler, OpenAI config defaults merged into
    every call, an HTTP proxy for this host, TLS settings other than verification against the
    default or SSL_CERT_FILE's bundle, or a base whose URL litellm builds its own way (one with a
    query or a fragment, or already ending in /chat/completions)."""
    if os.environ.get("OPENAI_CUSTOM_HEADERS") is not None or litellm.OpenAIConfig.get_config():
        return False
    if "?" in base or "#" in base or urlsplit(base).path.rstrip("/").endswith("/chat/completions"):
        return False
    if litellm.get_secret_bool("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER"):
        return False
    parts = urlsplit(base)
    proxies = urllib.request.getproxies_environment()
    if (parts.scheme in proxies or "all" in proxies) and not urllib.request.proxy_bypass(
        parts.hostname or ""
    ):
        return False
    if parts.scheme != "https":
        return True
    from litellm.llms.custom_httpx.http_handler import get_ssl_verify

    verify = get_ssl_verify()
    return verify is True or (isinstance(verify, str) and verify == os.environ.get("SSL_CERT_FILE"))


def read_completion(raw: bytes) -> Reply:
    """A chat completion's first message, read as litellm reads it: content null is an empty
    answer; content of another type, or no message at all, is unusable."""
    try:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        content = choice["message"].get("content")
        finish = choice.get("finish_reason")
    except (orjson.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError):
        return Reply(None, None, problem="a 2xx without a chat completion")
    usage = data.get("usage")
    counts, cache = None, (0, 0)
    if isinstance(usage, dict):
        counts = _counts(usage.get("prompt_tokens"), usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        # OpenAI names the cache's part of the prompt in its details; Anthropic-style servers at top level.
        read = details.get("cached_tokens", usage.get("cache_read_input_tokens"))
        written = details.get("cache_write_tokens", usage.get("cache_creation_input_tokens"))
        cache = _counts(read, written) or (0, 0)
    if content is not None and not isinstance(content, str):
        return Reply(None, counts, problem="a message whose content is not text", cache=cache)
    return Reply(content or "", counts, truncated=finish == "length", cache=cache)


def read_model_response(response: Any) -> Reply:
    """The same reading of litellm's `ModelResponse`, whatever the provider's wire format."""
    usage = getattr(response, "usage", None)
    counts, cache = None, (0, 0)
    if usage is not None:
        counts = _counts(getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0))
        # litellm maps every provider's cache counts (Anthropic's cache read and creation) here.
        details = getattr(usage, "prompt_tokens_details", None)
        read, written = getattr(details, "cached_tokens", 0), getattr(details, "cache_write_tokens", 0)
        cache = _counts(read, written) or (0, 0)
    try:
        choice = response.choices[0]
        content = choice.message.content
    except (AttributeError, IndexError, TypeError):
        return Reply(None, counts, problem="a 2xx without a message", cache=cache)
    if content is not None and not isinstance(content, str):
        return Reply(None, counts, problem="a message whose content is not text", cache=cache)
    return Reply(content or "", counts, truncated=choice.finish_reason == "length", cache=cache)


def _counts(prompt: Any, completion: Any) -> tuple[int, int] | None:
    """Token counts as reported, never below zero (a counter refuses to go down); a provider's
    garbage here costs the metric, never the answer."""
    try:
        return max(0, int(prompt or 0)), max(0, int(completion or 0))
    except (TypeError, ValueError, OverflowError):
        return None
