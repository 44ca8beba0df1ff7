"""The litellm interfaces `litellm_requests` relies on, pinned: an upgrade that changes provider
routing, parameter mapping, the URL, the headers or the request body fails here, by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from service.adapters.litellm_requests import chat_endpoint
from service.adapters.llm_client import import_litellm

litellm = import_litellm()
SCHEMA = {"type": "json_schema", "json_schema": {"name": "m", "strict": True, "schema": {"type": "object"}}}


def test_the_installed_litellm_is_inside_the_pinned_range() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    low, high = re.search(r'"litellm>=([\d.]+),<([\d.]+)"', pyproject).groups()  # type: ignore[union-attr]

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split(".")[:3])

    from importlib.metadata import version as installed

    assert version(low) <= version(installed("litellm")) < version(high)


def test_an_openai_compatible_model_resolves_to_its_chat_completions_url_and_bearer_key() -> None:
    endpoint = chat_endpoint(litellm, "openai/local-model", "http://127.0.0.1:8000/v1", "k-1")
    assert endpoint is not None
    assert (endpoint.model, endpoint.provider) == ("local-model", "openai")
    assert endpoint.url == "http://127.0.0.1:8000/v1/chat/completions"
    assert endpoint.headers == {"Authorization": "Bearer k-1", "Content-Type": "application/json"}


def test_openai_without_a_base_goes_to_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    endpoint = chat_endpoint(litellm, "gpt-4o-mini", None, None)
    assert endpoint is not None and endpoint.url == "https://api.openai.com/v1/chat/completions"
    assert endpoint.headers["Authorization"] == "Bearer sk-from-env"


@pytest.mark.parametrize(
    "model", ["anthropic/claude-3-5-haiku-20241022", "ollama/llama3", "gemini/gemini-1.5-flash"]
)
def test_other_wire_formats_stay_with_acompletion(model: str) -> None:
    assert chat_endpoint(litellm, model, "http://127.0.0.1:1", "k") is None


def test_parameters_and_body_are_litellm_mapping_and_transform() -> None:
    endpoint = chat_endpoint(litellm, "openai/gpt-4o-mini", "http://h/v1", "k")
    assert endpoint is not None
    params = endpoint.params(litellm, 512, SCHEMA)
    assert params == {"temperature": 0, "max_tokens": 512, "response_format": SCHEMA}
    messages = [{"role": "user", "content": "你好"}]
    body = endpoint.body(messages, params)
    assert (
        body
        == json.dumps(
            {"model": "gpt-4o-mini", "messages": messages, **params},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
    )
    assert endpoint.params(litellm, 64, None) == {"temperature": 0, "max_tokens": 64}


def test_a_parameter_the_model_refuses_is_refused_as_acompletion_refuses_it() -> None:
    """litellm's mapping knows o-series models take no temperature 0: a 400, so a setting to fix."""
    reasoning = chat_endpoint(litellm, "openai/o3-mini", "http://h/v1", "k")
    assert reasoning is not None
    with pytest.raises(litellm.UnsupportedParamsError) as refused:
        reasoning.params(litellm, 512, None)
    assert refused.value.status_code == 400
