"""The extraction prompt's conversation within its token budget: the head of the user's message and
the end of the assistant's reply kept, the cut marked, the estimate close to a real tokenizer."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.adapters.llm_client import import_litellm
from service.core.conversation_bound import bound_turn, estimate_tokens, keep_end, keep_head

MARK = re.compile(r"…\[cut (\d+) characters\]…")


def test_a_turn_within_the_budget_is_kept_whole() -> None:
    assert bound_turn("记住:报告用中文", "好的", 100) == ("记住:报告用中文", "好的")
    text = "x" * 250  # 250 characters, but about 63 tokens: counted, not cut by length
    assert bound_turn(text, "ok", 100) == (text, "ok")


def test_the_users_head_and_the_assistants_end_are_kept_and_the_cut_counted() -> None:
    user = "FACT-AT-HEAD " + "filler text " * 5000
    assistant = "preamble " * 5000 + " CONCLUSION-AT-END"
    kept_user, kept_assistant = bound_turn(user, assistant, 1000)

    assert kept_user.startswith("FACT-AT-HEAD") and kept_assistant.endswith("CONCLUSION-AT-END")
    head, cut = MARK.split(kept_user)[:2]
    assert user.startswith(head) and len(head) + int(cut) == len(user)
    _, cut, tail = MARK.split(kept_assistant)
    assert assistant.endswith(tail) and len(tail) + int(cut) == len(assistant)
    assert estimate_tokens(head, 10_000) + estimate_tokens(tail, 10_000) <= 1000


def test_a_short_side_leaves_its_share_to_the_other() -> None:
    user, assistant = bound_turn("以后都用 pnpm,别再用 npm 了。" + "细节" * 5000, "好的,记住了。", 1000)
    assert assistant == "好的,记住了。"
    assert estimate_tokens(MARK.split(user)[0], 10_000) > 900  # not half: the reply needed little

    user, assistant = bound_turn("ok then", "结论:" * 5000, 1000)
    assert user == "ok then" and estimate_tokens(MARK.split(assistant)[-1], 10_000) > 900


def test_chinese_counts_a_token_a_character() -> None:
    head = keep_head("中文" * 1000, 100)
    assert MARK.split(head)[0] == "中文" * 50
    end = keep_end("abcd" * 1000, 100)
    assert MARK.split(end)[-1] == "abcd" * 100


@pytest.mark.parametrize(
    "text",
    [
        "The repository moved from npm to pnpm last week; run pnpm install before the tests. " * 40,
        "这个仓库上周从 npm 迁移到了 pnpm,运行测试前请先执行 pnpm install。" * 40,
        "请用中文写报告, but keep identifiers such as `useState` in English. " * 40,
    ],
)
def test_the_estimate_is_within_a_quarter_of_gpt_4o_s_tokenizer_on_prose(text: str) -> None:
    litellm: Any = import_litellm()
    counted = litellm.token_counter(model="gpt-4o-mini", text=text)
    assert 0.75 * counted <= estimate_tokens(text, 100_000) <= 1.25 * counted
