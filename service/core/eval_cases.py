"""The labelled evaluation set's schema: one case is one extraction with its gold outcome.

A fact is judged by match rules (substrings after folding), not by one wording, so any faithful
wording a model chooses passes. Every case carries an example wording for each fact it names, which
the validators check against the rules: a case whose own examples fail its rules is mislabelled.
"""

from __future__ import annotations

import re
import unicodedata
from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.core.model import (
    MACHINE_SOURCES,
    MAX_EXTRACTED_CONTENT_CHARS,
    MAX_EXTRACTED_ITEMS,
    MIN_USER_MESSAGE_CHARS,
    Action,
    DismissedBy,
    Scope,
    Source,
    Status,
)
from service.core.normalize import identity

Language = Literal["zh", "en", "mixed"]
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_SPACES = re.compile(r"\s+")


class Category(StrEnum):
    EXPLICIT_PREFERENCE = "explicit_preference"
    PROJECT_FACT = "project_fact"
    ONE_OFF_TASK = "one_off_task"
    GUESS_OR_SMALL_TALK = "guess_or_small_talk"
    ASSISTANT_ONLY = "assistant_only"
    INJECTED_ECHO = "injected_echo"
    RESTATEMENT_TOUCH = "restatement_touch"
    MORE_COMPLETE_UPDATE = "more_complete_update"
    CHANGED_FACT_UPDATE = "changed_fact_update"
    DISMISSED_REWORDED = "dismissed_reworded"
    PROMPT_INJECTION = "prompt_injection"
    LONG_CONVERSATION = "long_conversation"
    NOTHING_WORTH_KEEPING = "nothing_worth_keeping"


def fold(text: str) -> str:
    """What match rules compare: NFKC (full-width forms), case folded, without whitespace, so that
    "20 号" and "20号", "Node 20" and "node20" are one term."""
    return _SPACES.sub("", unicodedata.normalize("NFKC", text).casefold())


def keeps_language(text: str, language: Language) -> bool:
    """A fact is in the user's language: Chinese (or Chinese with English terms) holds a CJK
    character, English holds none."""
    return bool(_CJK.search(text)) is (language != "en")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Match(_Strict):
    """Every `all` term, at least one `any` term (when given), no `none` term."""

    all_of: tuple[str, ...] = Field(default=(), alias="all")
    any_of: tuple[str, ...] = Field(default=(), alias="any")
    none_of: tuple[str, ...] = Field(default=(), alias="none")

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        terms = (*self.all_of, *self.any_of, *self.none_of)
        if not (self.all_of or self.any_of) or any(not fold(t) for t in terms):
            raise ValueError("a match rule needs an `all` or `any` term, and no empty term")
        return self

    def matches(self, text: str) -> bool:
        folded = fold(text)
        return (
            all(fold(t) in folded for t in self.all_of)
            and (not self.any_of or any(fold(t) in folded for t in self.any_of))
            and not any(fold(t) in folded for t in self.none_of)
        )


class PoolEntry(_Strict):
    """A memory stored before the turn."""

    id: str = Field(min_length=1)
    scope: Scope
    project_key: str | None = Field(default=None, alias="projectKey")
    content: str = Field(min_length=1, max_length=MAX_EXTRACTED_CONTENT_CHARS)
    source: Source = Source.AUTO
    status: Status = Status.ACTIVE
    dismissed_by: DismissedBy | None = Field(default=None, alias="dismissedBy")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.scope is Scope.PROJECT) != bool(self.project_key):
            raise ValueError(f"{self.id}: a PROJECT entry has a projectKey, a USER entry none")
        if (self.status is Status.DISMISSED) != (self.dismissed_by is not None):
            raise ValueError(f"{self.id}: dismissedBy is set exactly when the entry is DISMISSED")
        return self

    def shown(self, project_key: str | None) -> bool:
        """Whether the model is shown it with an id (D13's comparison set)."""
        in_session = self.scope is Scope.USER or self.project_key == project_key
        return self.status is Status.ACTIVE and self.source in MACHINE_SOURCES and in_session


class Keep(_Strict):
    """A fact the turn should leave stored, with the action that stores it."""

    match: Match
    scope: Scope
    action: Action
    target: str | None = None
    example: str = Field(min_length=1, max_length=MAX_EXTRACTED_CONTENT_CHARS)

    @model_validator(mode="after")
    def _target(self) -> Self:
        if (self.action is Action.INSERT) != (self.target is None):
            raise ValueError("an insert has no target; a touch or an update names one")
        if not self.match.matches(self.example):
            raise ValueError(f"the example {self.example!r} fails its own match rule")
        return self


class Distractor(_Strict):
    """A fact the turn mentions that must not be stored; `dismissed` names the user-dismissed pool
    entry it rewords."""

    match: Match
    example: str = Field(min_length=1, max_length=MAX_EXTRACTED_CONTENT_CHARS)
    dismissed: str | None = None

    @model_validator(mode="after")
    def _example(self) -> Self:
        if not self.match.matches(self.example):
            raise ValueError(f"the example {self.example!r} fails its own match rule")
        return self


class EvalCase(_Strict):
    id: str = Field(pattern=r"^[a-z0-9_-]+$")
    category: Category
    language: Language
    user: str
    assistant: str = Field(min_length=1)
    project_key: str | None = Field(default=None, alias="projectKey")
    pool: tuple[PoolEntry, ...] = ()
    keep: tuple[Keep, ...] = Field(default=(), max_length=MAX_EXTRACTED_ITEMS)
    distractors: tuple[Distractor, ...] = ()
    note: str = ""

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if len(identity(self.user)) < MIN_USER_MESSAGE_CHARS:
            raise ValueError(
                f"{self.id}: a user message under {MIN_USER_MESSAGE_CHARS} characters never reaches the model"
            )
        pool = {p.id: p for p in self.pool}
        if len(pool) != len(self.pool):
            raise ValueError(f"{self.id}: pool ids repeat")
        for keep in self.keep:
            self._check_keep(keep, pool)
        for distractor in self.distractors:
            if not keeps_language(distractor.example, self.language):
                raise ValueError(f"{self.id}: {distractor.example!r} is not in the case's language")
            if any(k.match.matches(distractor.example) for k in self.keep):
                raise ValueError(f"{self.id}: distractor {distractor.example!r} matches a fact to keep")
            entry = pool.get(distractor.dismissed or "")
            if distractor.dismissed and (entry is None or entry.dismissed_by is not DismissedBy.USER):
                raise ValueError(f"{self.id}: {distractor.dismissed} is no user-dismissed pool entry")
        return self

    def _check_keep(self, keep: Keep, pool: dict[str, PoolEntry]) -> None:
        if keep.scope is Scope.PROJECT and not self.project_key:
            raise ValueError(f"{self.id}: a project fact needs the case's projectKey")
        if not keeps_language(keep.example, self.language):
            raise ValueError(f"{self.id}: {keep.example!r} is not in the case's language")
        if any(d.match.matches(keep.example) for d in self.distractors):
            raise ValueError(f"{self.id}: {keep.example!r} matches a distractor")
        if keep.target is None:
            return
        entry = pool.get(keep.target)
        if entry is None or not entry.shown(self.project_key) or entry.scope is not keep.scope:
            raise ValueError(f"{self.id}: target {keep.target} is not a shown {keep.scope} entry")
        if keep.action is Action.TOUCH and (
            not keep.match.matches(entry.content)
            or any(d.match.matches(entry.content) for d in self.distractors)
        ):
            raise ValueError(
                f"{self.id}: the touched {keep.target} fails the fact's rule or matches a distractor"
            )
        if keep.action is Action.UPDATE and fold(keep.example) == fold(entry.content):
            raise ValueError(f"{self.id}: an update's example repeats {keep.target}")
