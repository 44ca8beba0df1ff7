"""litellm's request building for OpenAI's chat format, without `acompletion`'s per-call machinery.

`litellm.acompletion` spends several milliseconds of CPU per call on things this service does not
use (logging objects, cost bookkeeping, callback dispatch, a thread-pool hop). For a model that
litellm serves with its `openai` provider (OpenAI itself and every OpenAI-compatible server named
`openai/<model>` with an API base), the same request is built here from litellm's own pieces:
provider routing (`get_llm_provider`), parameter mapping (`get_optional_params`), and the provider
config's URL, headers and `transform_request`. Models of other providers (Anthropic, Bedrock,
Vertex, Gemini, …) keep going through `acompletion`, which translates their wire formats.

These are litellm interfaces outside its documented API: the version range is pinned in
pyproject.toml and `tests/unit/test_litellm_requests.py` fails loudly when an upgrade changes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# Providers whose chat requests litellm sends through the OpenAI SDK as this module builds them.
FAST_PROVIDERS = frozenset({"openai"})
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"


@dataclass(frozen=True, slots=True)
class ChatEndpoint:
    """A model resolved once: where its requests go, with which headers, built by which config."""

    model: str  # as the provider names it
    provider: str
    url: str
    headers: dict[str, str]
    config: Any

    def params(self, litellm: Any, max_tokens: int, response_format: dict[str, Any] | None) -> dict[str, Any]:
        """litellm's mapping of the call's parameters for this provider; the same for every call of a
        (mode, token cap), so the client keeps it."""
        extra = {"response_format": response_format} if response_format is not None else {}
        mapped = litellm.get_optional_params(
            model=self.model, custom_llm_provider=self.provider, temperature=0, max_tokens=max_tokens, **extra
        )
        # The OpenAI SDK sends neither a non-streaming flag nor an empty extra body.
        if mapped.get("stream") is False:
            del mapped["stream"]
        if not mapped.get("extra_body"):
            mapped.pop("extra_body", None)
        return dict(mapped)

    def body(self, messages: list[dict[str, str]], params: dict[str, Any]) -> bytes:
        data = self.config.transform_request(
            model=self.model, messages=messages, optional_params=dict(params), litellm_params={}, headers={}
        )
        return orjson.dumps(data)


def chat_endpoint(litellm: Any, model: str, api_base: str | None, api_key: str | None) -> ChatEndpoint | None:
    """The endpoint of `model` if litellm speaks OpenAI's chat format to it; None otherwise."""
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
    if config is None:
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
    return ChatEndpoint(name, provider, url, dict(headers), config)
