"""The litellm interfaces `litellm_requests` relies on, pinned: an upgrade that changes provider
routing, parameter mapping, the URL, the headers or the request body fails here, by name."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from service.adapters.litellm_requests import cache_marked, chat_endpoint, lowest_effort, model_params
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
    assert endpoint.headers == {
        "Accept": "application/json",
        "Authorization": "Bearer k-1",
        "Content-Type": "application/json",
    }


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
    call = model_params(litellm, "openai/gpt-4o-mini", 512, None, 4096)
    assert call == {"temperature": 0, "max_tokens": 512, "drop_params": True}
    params = endpoint.params(litellm, call | {"response_format": SCHEMA})
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
    assert endpoint.params(litellm, model_params(litellm, "openai/gpt-4o-mini", 64, None, 0)) == {
        "temperature": 0,
        "max_tokens": 64,
    }


TRICKY = [
    {"role": "system", "content": '规则 "引号" \\ 反斜杠\n第二行 \u2028 \x00 </memories>'},
    {"role": "user", "content": '请记住:报告用中文写 👍 {"memories": []}'},
]


@pytest.mark.parametrize(
    "model",
    [
        "openai/gpt-4o-mini",
        "openai/gpt-4.1-mini",
        "openai/gpt-5-mini",
        "openai/gpt-5-nano",
        "openai/gpt-5.1",
        "openai/o4-mini",
        "openai/o3-mini",
        "openai/o1",
        "openai/local-model",
    ],
)
@pytest.mark.parametrize("fmt", [SCHEMA, {"type": "json_object"}, None])
def test_a_calls_body_from_the_template_is_litellms_byte_for_byte(
    model: str, fmt: dict[str, Any] | None
) -> None:
    endpoint = chat_endpoint(litellm, model, "http://h/v1", "k")
    assert endpoint is not None
    call = model_params(litellm, model, 512, None, 4096) | ({"response_format": fmt} if fmt else {})
    params = endpoint.params(litellm, call)
    template = endpoint.template(("system", "user"), params)
    assert template is not None
    for messages in (TRICKY, [{"role": "system", "content": "x"}, {"role": "user", "content": ""}]):
        assert template.body(messages) == endpoint.body([dict(m) for m in messages], params)


class Rewriting:
    """A provider config whose request depends on the texts: the template must not stand in."""

    def __init__(self, change: str) -> None:
        self.change = change

    def transform_request(self, model: str, messages: list[dict[str, str]], **_: Any) -> dict[str, Any]:
        if self.change == "text":
            messages = [{**m, "content": "> " + m["content"]} for m in messages]
        if self.change == "key":
            messages = [{**m, "name": "x"} for m in messages]
        request: dict[str, Any] = {"model": model, "messages": messages}
        if self.change == "head":
            request["prompt_cache_key"] = str(sum(map(ord, "".join(m["content"] for m in messages))))
        if self.change == "merge":
            request["messages"] = [{"role": "user", "content": "".join(m["content"] for m in messages)}]
        return request


@pytest.mark.parametrize("change", ["text", "key", "head", "merge"])
def test_a_transform_that_reads_the_texts_gets_no_template(change: str) -> None:
    endpoint = chat_endpoint(litellm, "openai/local-model", "http://h/v1", "k")
    assert endpoint is not None
    rewriting = dataclasses.replace(endpoint, config=Rewriting(change))
    assert rewriting.template(("system", "user"), {}) is None
    assert (
        dataclasses.replace(endpoint, config=Rewriting("none")).template(("system", "user"), {}) is not None
    )


@pytest.mark.parametrize(
    ("model", "effort", "expected"),
    [
        # Reasoning on every call: no temperature 0, the lowest effort litellm's map flags, and room
        # for the reasoning in a budget litellm sends as max_completion_tokens.
        ("openai/gpt-5-mini", None, {"max_completion_tokens": 512 + 4096, "reasoning_effort": "minimal"}),
        ("openai/gpt-5-nano", None, {"max_completion_tokens": 512 + 4096, "reasoning_effort": "minimal"}),
        ("openai/o4-mini", None, {"max_completion_tokens": 512 + 4096, "reasoning_effort": "low"}),
        ("openai/o3-mini", None, {"max_completion_tokens": 512 + 4096, "reasoning_effort": "low"}),
        ("openai/gpt-5-mini", "medium", {"max_completion_tokens": 512 + 4096, "reasoning_effort": "medium"}),
        # Reasoning off unless asked for: no effort, room for reasoning all the same.
        ("openai/gpt-5.1", "low", {"temperature": 0, "max_completion_tokens": 512 + 4096}),
        ("openai/gpt-4o-mini", "low", {"temperature": 0, "max_tokens": 512}),
        ("openai/local-model", None, {"temperature": 0, "max_tokens": 512}),
    ],
)
def test_each_model_gets_the_parameters_it_takes(
    model: str, effort: str | None, expected: dict[str, Any]
) -> None:
    endpoint = chat_endpoint(litellm, model, "http://h/v1", "k")
    assert endpoint is not None
    assert endpoint.params(litellm, model_params(litellm, model, 512, effort, 4096)) == expected


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"reasoning_effort_levels": ["high", "medium"]}, "medium"),  # a row listing its levels
        ({"supports_none_reasoning_effort": True, "supports_minimal_reasoning_effort": True}, "none"),
        ({"supports_none_reasoning_effort": False, "supports_minimal_reasoning_effort": True}, "minimal"),
        ({"supports_reasoning": True}, "low"),
        ({}, "low"),  # a model outside litellm's map
    ],
)
def test_the_lowest_effort_is_read_from_the_model_map(row: dict[str, Any], expected: str) -> None:
    assert lowest_effort(row) == expected


def test_the_reasoning_budget_stays_within_the_models_output_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    info = litellm.get_model_info(model="o4-mini", custom_llm_provider="openai")
    monkeypatch.setattr(litellm, "get_model_info", lambda **_: {**info, "max_output_tokens": 5000})
    assert model_params(litellm, "openai/o4-mini", 1024, None, 8192)["max_tokens"] == 5000


@pytest.mark.parametrize("model", ["anthropic/claude-sonnet-4-20250514", "anthropic/claude-haiku-4-5"])
def test_a_claude_model_is_not_made_to_think(model: str) -> None:
    """litellm turns any reasoning effort into Claude's extended thinking, which is opt-in and
    refuses temperature 0: Claude gets no effort, only the room every reasoning model gets."""
    assert model_params(litellm, model, 512, "low", 4096) == {
        "temperature": 0,
        "max_tokens": 512 + 4096,
        "drop_params": True,
    }


@pytest.mark.parametrize(
    "model", ["gemini/gemini-2.5-pro", "gemini/gemini-2.5-flash", "vertex_ai/gemini-2.5-pro"]
)
def test_a_model_that_thinks_by_default_gets_room_for_its_thinking(model: str) -> None:
    """Gemini 2.5 takes temperature 0 and thinks on every call unless told not to: its thinking is
    spent inside the completion budget, which would leave the answer cut short."""
    assert model_params(litellm, model, 512, None, 4096) == {
        "temperature": 0,
        "max_tokens": 512 + 4096,
        "drop_params": True,
    }


def test_the_configuration_the_openai_sdk_reads_is_in_the_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-litellm-env")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-sdk-env")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    monkeypatch.setattr(litellm, "headers", {"X-Gateway": "g1", "authorization": "Bearer override"})
    endpoint = chat_endpoint(litellm, "openai/local-model", "http://127.0.0.1:8000/v1", "k-1")
    assert endpoint is not None
    assert endpoint.headers == {
        "Accept": "application/json",
        "Content-Type": "application/json",
        "OpenAI-Organization": "org-litellm-env",  # litellm's choice comes before the SDK's own
        "OpenAI-Project": "proj-1",
        "X-Gateway": "g1",
        "authorization": "Bearer override",
    }


@pytest.mark.parametrize(
    ("variable", "value", "base"),
    [
        ("OPENAI_CUSTOM_HEADERS", "X-Team: memory", "http://127.0.0.1:8000/v1"),
        ("HTTP_PROXY", "http://proxy:3128", "http://10.0.0.5:8000/v1"),
        ("ALL_PROXY", "http://proxy:3128", "https://api.example.com/v1"),
        ("SSL_VERIFY", "false", "https://api.example.com/v1"),
        ("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER", "true", "http://127.0.0.1:8000/v1"),
    ],
)
def test_a_configuration_this_path_does_not_reproduce_goes_through_acompletion(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, base: str
) -> None:
    assert chat_endpoint(litellm, "openai/local-model", base, "k") is not None
    monkeypatch.setenv(variable, value)
    assert chat_endpoint(litellm, "openai/local-model", base, "k") is None


def test_no_static_key_leaves_authentication_to_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workload identity or a missing key: litellm and the SDK decide, not this path."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert chat_endpoint(litellm, "gpt-4o-mini", "https://api.openai.com/v1", None) is None


def test_a_proxy_the_host_bypasses_keeps_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert chat_endpoint(litellm, "openai/local-model", "http://127.0.0.1:8000/v1", "k") is not None


def test_an_extraction_prompt_is_marked_at_its_user_block_its_frozen_blocks_and_its_log() -> None:
    """A call that appended to the log still reads the frozen blocks from the cache, and one in
    another project the USER block: each prefix ends at a marked part, at most four marks."""
    blocks = [
        "User memories:\n1\t报告用中文",
        "Project memories:\n2\tuses pnpm",
        "Changes:\n3\tuser\t新",
        "Conversation:\n{}",
    ]
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "\n\n".join(blocks)}]
    [system, user] = cache_marked(messages)
    ephemeral = {"type": "ephemeral"}
    assert system["content"] == [{"type": "text", "text": "rules", "cache_control": ephemeral}]
    assert user["content"] == [
        {"type": "text", "text": blocks[0], "cache_control": ephemeral},
        {"type": "text", "text": "\n\n" + blocks[1], "cache_control": ephemeral},
        {"type": "text", "text": "\n\n" + blocks[2], "cache_control": ephemeral},
        {"type": "text", "text": "\n\n" + blocks[3]},
    ]
    without_log = "\n\n".join([blocks[0], blocks[3]])
    assert cache_marked([{"role": "user", "content": without_log}])[0]["content"] == [
        {"type": "text", "text": blocks[0], "cache_control": ephemeral},
        {"type": "text", "text": "\n\n" + blocks[3]},
    ]
    assert cache_marked([{"role": "user", "content": "one block"}]) == [
        {"role": "user", "content": "one block"}
    ]
