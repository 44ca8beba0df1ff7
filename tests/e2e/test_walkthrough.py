"""docs/api.md's "Your first memory", executed as written from a clean clone.

The clone holds the working tree's files (tracked and not ignored), so what is tested is what would
be committed. The walkthrough's `make run` installs from the package registry, which a fresh network
namespace cannot reach, so the clone is installed beforehand: it shares the suite's own virtual
environment when `make test` built one (the same files, an editable install of the same tree; the
stamp's copy-preserved times tell `make` it is current), and runs `make install` otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import OUTPUT, ROOT
from tests.support.walkthrough import FACT, shown_answer, steps

DOC = ROOT / "docs" / "api.md"

pytestmark = pytest.mark.skipif(
    not (sys.platform == "linux" and shutil.which("unshare") and shutil.which("ip")),
    reason="needs Linux network namespaces (unshare, ip) for a port set of its own",
)


def clean_clone(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())
    return target


def test_the_document_marks_every_step() -> None:
    found = steps(DOC.read_text())
    assert [s.background for s in found] == [False, True, False, False, False]
    assert "cat > .env" in found[0].code and found[1].code.strip() == "make run"
    assert found[-1].until == "周报"


def test_the_first_memory_walkthrough_reaches_the_injection(tmp_path: Path) -> None:
    clone = clean_clone(tmp_path / "clone")
    if (ROOT / ".venv" / ".dev-stamp").exists():
        (clone / ".venv").symlink_to(ROOT / ".venv")
    install = subprocess.run(
        ["make", "install"], cwd=clone, check=False, capture_output=True, text=True, timeout=900
    )
    assert install.returncode == 0, install.stderr[-2000:]
    namespace = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    done = subprocess.run(
        [
            *namespace,
            sys.executable,
            "-m",
            "tests.support.walkthrough",
            str(clone),
            str(clone / "docs/api.md"),
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    OUTPUT.mkdir(parents=True, exist_ok=True)
    log = clone / "walkthrough-service.log"
    if log.exists():
        shutil.copy(log, OUTPUT / "walkthrough-service.log")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    (OUTPUT / "walkthrough.json").write_text(json.dumps(result, ensure_ascii=False, indent=2))

    ran = result["steps"]
    assert len(ran) == 5, "a step failed; see tests/output/walkthrough.json"
    assert all(step.get("rc", 0) == 0 for step in ran), ran
    ready, switched = (json.loads(line) for line in ran[2]["stdout"].splitlines())
    assert ready["status"] == "ok" and switched["data"] == {"autoCaptureEnabled": True}
    answer = json.loads(ran[4]["stdout"])
    assert answer == shown_answer(DOC.read_text())
    injection = answer["data"]
    assert injection["memories"] == [{"scope": "USER", "projectKey": None, "content": FACT}]
    assert f"- [用户] {FACT}" in injection["prompt"]
    # The model the document names, on the base URL it gives, without a key configured.
    (call,) = result["model_requests"]
    assert call["model"] == "qwen2.5:3b" and call["path"] == "/v1/chat/completions"
    assert call["authorization"].startswith("Bearer ")
