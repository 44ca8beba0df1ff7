"""A deterministic, seeded model that answers the service's prompts the way real models do.

It reads only what the service sends: the facts the conversation mentions, the memories shown
under aliases, the dismissed list, the memories of a consolidation. Then it restates known facts in
new words, touches, updates with more complete wording, invents new facts, sometimes answers
garbage or references ids it was not shown, merges and drops during consolidation, and now and
then proposes a dismissed fact again in new words. Every choice comes from a hash of the seed and
the prompt, so the same pool and the same conversation always get the same answer.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import unicodedata
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tests.support.scripted_llm import Request

FACT = re.compile(r"用户(\d+)的事实(\d+)")
MENTION = re.compile(r"事实(\d+)")
USER = re.compile(r"用户(\d+)本轮")
STYLES = [
    "偏好用中文写报告",
    "报告请用中文撰写",
    "习惯中文输出的报告",
    "输出报告时使用中文",
    "报告一律中文",
    "中文写报告,附摘要",
]


def wording(user: int, fact: int, style: int, complete: bool = False) -> str:
    """A fact's text: the same (user, fact) in another style is a paraphrase the hash cannot see."""
    text = f"用户{user}的事实{fact}:{STYLES[style % len(STYLES)]}"
    return text + "(含完整细节与适用范围)" if complete else text


def fact_type(fact: int) -> str:
    return "project" if fact % 3 == 0 else "user"


def conversation(user: int, facts: list[int]) -> str:
    mentioned = "、".join(f"事实{k}" for k in facts)
    return f"用户{user}本轮确认:{mentioned}。请长期记住这些偏好和项目约定。"


def fact_of(content: str) -> tuple[int, int] | None:
    match = FACT.search(unicodedata.normalize("NFKC", content))
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass
class SimModel:
    """The answers; stateless, so it can serve from another process."""

    seed: int

    def __call__(self, request: Request) -> str:
        data = request.data
        rng = random.Random(hashlib.sha256(f"{self.seed}|{request.text}".encode()).digest())
        return self._consolidate(data, rng) if "memories" in data else self._extract(data, rng)

    def _extract(self, data: dict[str, Any], rng: random.Random) -> str:
        roll = rng.random()
        if roll < 0.02:
            return "好的,我已经记住了这些偏好。"  # prose, not JSON
        if roll < 0.03:
            return json.dumps([{"type": "user", "content": f"多余的事实{i}"} for i in range(4)])
        user_match = USER.search(data["conversation"]["user"])
        if user_match is None:
            return "[]"
        user = int(user_match.group(1))
        shown: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for entry in data["existing"]:
            parsed = fact_of(entry["content"])
            if parsed:
                shown[parsed[1]].append((entry["id"], entry["content"]))
        dismissed = {p[1] for p in map(fact_of, data["dismissed"]) if p}
        items = [
            item
            for fact in map(int, MENTION.findall(data["conversation"]["user"]))
            if (item := self._about(user, fact, shown.get(fact, []), fact in dismissed, rng)) is not None
        ]
        if rng.random() < 0.03:
            items.append({"type": "user", "action": "touch", "existingId": rng.choice([0, 999, -1, "7"])})
        if rng.random() < 0.02:
            items.append({"type": "user", "action": "insert", "content": "很长的事实" * 30})
        if rng.random() < 0.02:
            items.append({"type": "preference", "action": "insert", "content": "类型不对的事实"})
        text = json.dumps(items[:3], ensure_ascii=False)
        return f"```json\n{text}\n```" if rng.random() < 0.1 else text

    def _about(
        self, user: int, fact: int, aliases: list[tuple[int, str]], dismissed: bool, rng: random.Random
    ) -> dict[str, Any] | None:
        kind = fact_type(fact)
        style = rng.randrange(len(STYLES))
        if dismissed and not aliases:
            if rng.random() < 0.9:
                return None
            return {"type": kind, "action": "insert", "content": wording(user, fact, style)}
        if not aliases:
            return {
                "type": kind,
                "action": "insert",
                "content": self._lookalike(wording(user, fact, style), rng),
            }
        roll = rng.random()
        alias, content = rng.choice(aliases)
        if roll < 0.1:
            # It echoes a stored memory as a new one, with a difference no reader can see.
            return {"type": kind, "action": "insert", "content": self._lookalike(content, rng, always=True)}
        if roll < 0.5:
            return {"type": kind, "action": "touch", "existingId": alias}
        if roll < 0.7:
            complete = wording(user, fact, style, complete=rng.random() < 0.5)
            return {"type": kind, "action": "update", "existingId": alias, "content": complete}
        # A restatement the model did not match: the duplicate consolidation exists for.
        return {"type": kind, "action": "insert", "content": self._lookalike(wording(user, fact, style), rng)}

    @staticmethod
    def _lookalike(text: str, rng: random.Random, always: bool = False) -> str:
        """Sometimes the same words with invisible or full-width differences."""
        roll = rng.random() * (0.1 if always else 1.0)
        if roll < 0.05:
            return text.replace("的", "\u200b的", 1)
        if roll < 0.08:
            return text.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
        if roll < 0.1:
            return "\ufeff" + text + "  "
        return text

    def _consolidate(self, data: dict[str, Any], rng: random.Random) -> str:
        if rng.random() < 0.03:
            return "这些记忆看起来都很好。"
        by_fact: dict[tuple[int, int], list[int]] = defaultdict(list)
        for memory in data["memories"]:
            parsed = fact_of(memory["content"])
            if parsed:
                by_fact[parsed].append(memory["id"])
        ops: list[dict[str, Any]] = []
        for (user, fact), ids in sorted(by_fact.items()):
            if len(ids) < 2:
                continue
            roll = rng.random()
            if roll < 0.7:
                content = wording(user, fact, rng.randrange(len(STYLES)), complete=rng.random() < 0.3)
                ops.append({"op": "merge", "sourceIds": ids, "content": content})
            elif roll < 0.9:  # the kept row named, or kept by not being mentioned
                ops += [{"op": "keep", "sourceIds": ids[:1]}] if roll < 0.8 else []
                ops.append({"op": "drop", "sourceIds": ids[1:]})
        if rng.random() < 0.03:
            ops.append({"op": "drop", "sourceIds": [len(data["memories"]) + 5]})  # an id it was not shown
        return json.dumps(ops, ensure_ascii=False)


def main() -> None:
    """`python -m tests.simulation.model SEED`: serve on loopback, print the base URL, stop at EOF."""
    import sys

    from tests.support.scripted_llm import ScriptedLlm

    server = ScriptedLlm(record=False).start()
    server.responder = SimModel(int(sys.argv[1]))
    print(server.api_base, flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
