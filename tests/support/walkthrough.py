"""Runs docs/api.md's "first memory" walkthrough as written, inside a network namespace of its own.

The document's commands name `make run`'s fixed ports (8080, 9092) and the reader's local model
(Ollama's 11434). A fresh network namespace is a free port set where those ports are certainly
unused, so the blocks run verbatim: this module is started under `unshare --net`, brings loopback
up, plays the local model on the port the document's `.env` names, and runs the blocks in a clean
clone. It prints one JSON object: what each block printed and what the model was asked.

    python -m tests.support.walkthrough <clone> <doc>
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.scripted_llm import Request, ScriptedLlm

# `<!-- first-memory -->`, `<!-- first-memory: background -->` or `<!-- first-memory: until TEXT -->`
# right before a ```sh block marks it as a step.
_STEP = re.compile(r"<!-- first-memory(?:: (background|until (.+?)))? -->\n```sh\n(.*?)```", re.DOTALL)
UNTIL_S = 90.0
# What the local model answers: the fact the walkthrough's user states, in the extraction format.
FACT = "周报用中文写,结论放在最前面"


@dataclass(frozen=True)
class Step:
    code: str
    background: bool = False
    until: str | None = None


def steps(doc: str) -> list[Step]:
    return [
        Step(code=code, background=kind == "background", until=until or None)
        for kind, until, code in _STEP.findall(doc)
    ]


def shown_answer(doc: str) -> Any:
    """The JSON the document shows right after its last step."""
    found = re.search(r"<!-- first-memory: until .+? -->\n```sh\n.*?```\n```json\n(.*?)```", doc, re.DOTALL)
    assert found, "the walkthrough shows no answer after its last step"
    return json.loads(found.group(1))


def model_port(doc: str) -> int:
    """The port of the model the document's `.env` points at."""
    found = re.search(r"^MEMORY_LLM_API_BASE=(\S+)$", doc, re.MULTILINE)
    assert found, "the walkthrough's .env names no MEMORY_LLM_API_BASE"
    return urlsplit(found.group(1)).port or 80


def _answer(request: Request) -> str | None:
    if "周报" not in request.text:
        return None
    return json.dumps(
        {"memories": [{"type": "user", "action": "insert", "existingId": None, "content": FACT}]}
    )


def _clean_env() -> dict[str, str]:
    """The reader's shell: no MEMORY_* left over from whoever started the tests."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}


def _run(step: Step, clone: Path, env: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + UNTIL_S
    tries = 0
    while True:
        tries += 1
        done = subprocess.run(
            ["bash", "-e", "-c", step.code],
            check=False,
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        found = step.until is None or step.until in done.stdout
        if done.returncode != 0 or found or time.monotonic() > deadline:
            return {
                "code": step.code,
                "rc": done.returncode,
                "stdout": done.stdout,
                "stderr": done.stderr,
                "tries": tries,
            }
        time.sleep(1.0)  # the reader runs it again a moment later


def main(clone: Path, doc_path: Path) -> dict[str, Any]:
    doc = doc_path.read_text()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    model = ScriptedLlm(port=model_port(doc)).start()
    model.responder = _answer
    env = _clean_env()
    results: list[dict[str, Any]] = []
    background: list[subprocess.Popen[bytes]] = []
    log = (clone / "walkthrough-service.log").open("wb")
    try:
        for step in steps(doc):
            if step.background:
                background.append(
                    subprocess.Popen(
                        ["bash", "-e", "-c", step.code],
                        cwd=clone,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                results.append({"code": step.code, "background": True})
                continue
            results.append(_run(step, clone, env))
            if results[-1]["rc"] != 0:
                break
    finally:
        exits = []
        for process in background:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                exits.append(process.wait(timeout=30))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                exits.append(process.wait())
        model.stop()
    requests = [
        {"model": r.model, "path": r.path, "authorization": r.headers.get("authorization")}
        for r in model.requests
    ]
    return {"steps": results, "background_exits": exits, "model_requests": requests}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), ensure_ascii=False))
