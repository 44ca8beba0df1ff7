"""README.md and docs/*.md: every relative link resolves (files and GitHub-style #anchors), and the
pages that restate the code still match it: configuration.md against `Settings` (the way
test_config.py holds `.env.example`), metrics.md against the registry, decisions.md against the
modules it names, operations.md's model failure table against the client's classes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from service.adapters.llm_failures import status_class
from service.adapters.metrics import Metrics
from service.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, where links and headings count."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page.read_text()):
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [target for line in prose(page.read_text()) for target in _LINK.findall(line)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if _SCHEME.match(target):
            continue  # a web address: not this repository's to check
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with this anchor")
    return broken


def test_the_slug_is_githubs() -> None:
    assert slug("Running it locally: `make run`") == "running-it-locally-make-run"
    assert slug("Publishing `task.finished`") == "publishing-taskfinished"
    assert slug("The platform's UI: the user's own memories") == "the-platforms-ui-the-users-own-memories"
    assert slug("Consolidation (D15)") == "consolidation-d15"
    assert slug("MEMORY_LOG_LEVEL and 401 messages") == "memory_log_level-and-401-messages"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-part) [self](#page) [web](https://example.com/x)\n"
        "[gone](missing.md) [no anchor](other.md#nothing) [here](#nowhere)\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nothing: no heading with this anchor",
        "#nowhere: no heading with this anchor",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_docs_are_all_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(ROOT / "README.md")}
    assert set(DOCS.glob("*.md")) <= linked


def rows(page: Path, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(first cell, second cell) of each table row the pattern matches."""
    return [(m.group(1), m.group(2)) for line in page.read_text().splitlines() if (m := pattern.match(line))]


# --- configuration.md -------------------------------------------------------------------------

_SETTING_ROW = re.compile(r"^\| `(MEMORY_[A-Z0-9_]+)` \| ([^|]*?) \|")


def test_configuration_lists_every_setting_at_its_real_default() -> None:
    listed = rows(DOCS / "configuration.md", _SETTING_ROW)
    documented = dict(listed)
    assert len(documented) == len(listed), "a variable is listed twice"
    assert set(documented) == {f"MEMORY_{name.upper()}" for name in Settings.model_fields}
    defaults = Settings(_env_file=None)
    for variable, cell in documented.items():
        name = variable.removeprefix("MEMORY_").lower()
        if cell == "unset":
            assert getattr(defaults, name) is None, variable
            continue
        value = re.fullmatch(r"`([^`]*)`", cell)
        assert value, f"{variable}: the default is `value` or unset, not {cell!r}"
        stated = Settings(_env_file=None, **{name: value.group(1)})  # type: ignore[arg-type]
        assert getattr(stated, name) == getattr(defaults, name), variable


# --- metrics.md -------------------------------------------------------------------------------

_METRIC_ROW = re.compile(r"^\| `(mao_memory_\w+)` \|([^|]*)\|")


def test_metrics_lists_every_metric_and_every_label_value() -> None:
    documented = dict(rows(DOCS / "metrics.md", _METRIC_ROW))
    registry = Metrics(CollectorRegistry()).registry
    families = [f for f in registry.collect() if f.name.startswith("mao_memory_")]
    exposed = {f"{f.name}_total" if f.type == "counter" else f.name: f for f in families}
    assert set(documented) == set(exposed)
    for name, family in exposed.items():
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label == "le":
                    continue
                cell = documented[name]
                assert f"`{label}`" in cell, f"{name}: label {label}"
                assert re.search(rf"(?<!\w){re.escape(value)}(?!\w)", cell), f"{name}: {label}={value}"


# --- decisions.md -----------------------------------------------------------------------------

_TARGET = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def defines(source: str, name: str) -> bool:
    pattern = rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*(?::[^=\n]*)?="
    return re.search(pattern, source, re.MULTILINE) is not None


def test_defines() -> None:
    source = "class A:\n    x: int = 1\n\n    async def b(self): ...\nC = 2\n"
    assert all(defines(source, name) for name in ("A", "x", "b", "C"))
    assert not defines(source, "D") and not defines(source, "self")


def test_each_decision_names_code_that_exists() -> None:
    lines = (DOCS / "decisions.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("| ") and not line.startswith(("| |", "| decision |"))]
    seed = re.findall(r"^\| (D\d+) \|", "\n".join(table), re.MULTILINE)
    assert seed == [f"D{n}" for n in range(1, 16)]
    for row in table:
        code = row.rstrip().removesuffix("|").rsplit("|", 1)[1]
        parts = _TARGET.split(code)
        named = 0
        for target, after in zip(parts[1::2], parts[2::2], strict=True):
            source = (DOCS / target).read_text()
            for name in re.findall(r"`([A-Za-z_][\w.]*)`", after):
                for part in name.split("."):
                    assert defines(source, part), f"{target} defines no {part} ({row[:60]}…)"
                named += 1
        assert named, f"no code named: {row[:80]}…"


# --- operations.md: the model failure table -----------------------------------------------------

_FAILURE_ROW = re.compile(r"^\| ([^|]*) \| (OUTAGE|EVENT|REJECTED) \|")


def test_the_failure_table_classes_statuses_as_the_client_does() -> None:
    table = rows(DOCS / "operations.md", _FAILURE_ROW)
    assert [cls for _, cls in table] == ["OUTAGE", "EVENT", "REJECTED"]
    for got, cls in table:
        statuses = [int(n) for n in re.findall(r"\b[1-5]\d\d\b", got)]
        if "5xx" in got:
            statuses += [500, 502, 503, 599]
        if "other 4xx" in got:
            statuses += [400, 401, 403, 404, 413, 422]
        assert statuses, got
        assert {status_class(s).name for s in statuses} == {cls}, got
