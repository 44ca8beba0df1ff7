"""Each extraction model's quality in production, read from what users later did to its memories.

The rules, over the memories an extraction inserted (history `insert` by actor `auto`) inside the
window (`WINDOW`, by creation time), attributed to the model on that insert row:

- A memory is *rejected* by the user's first `dismiss`, `delete` or `edit` of it (actor `user`),
  of that kind; a later rejection of the same memory does not count again, and a restore is no
  rejection. A rejection counts toward a horizon (7 or 30 days) when it came within that many days
  of the insert.
- A horizon's cohort is the memories at least that many days old: a younger one's days are not over,
  and counting it would make a newly chosen model look better than it is. So the rate within 30 days
  is over an older cohort than the rate within 7 days, and shows once a model is 30 days in use.
- A memory is *re-confirmed* when a later extraction (actor `auto`, any model) touched it;
  `touches` counts every such touch, a folded run of touches (retention) as its length.

Only actions, actors, models and times are read, never a text: a user's delete erases the words of
a memory's history and keeps the rest, so deleted memories still count. The database groups the
memories into `Cell`s; `summarize` turns them into one `ModelQuality` per model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

WINDOW = timedelta(days=90)
HORIZONS_DAYS = (7, 30)
# Models are few (one setting, changed by hand), but a label's range must be bounded whatever the
# history holds: the models with the most memories keep their name, the rest are summed as OTHER.
MAX_MODELS = 10
OTHER_MODELS = "(other)"
NO_MODEL = "(none)"


class Rejection(StrEnum):
    """The `kind` label: the user's first rejecting action on the memory (history action values)."""

    DISMISSED = "dismiss"
    DELETED = "delete"
    EDITED = "edit"

    @property
    def label(self) -> str:
        """As metrics and the API name it: "dismissed", "deleted", "edited"."""
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Cell:
    """Memories alike in model, age and fate: `matured_days` is the longest horizon their age has
    passed (0 for none); `rejected_within` the shortest horizon that holds their first rejection
    (None when not rejected, or later than every horizon)."""

    model: str | None
    matured_days: int
    rejection: Rejection | None
    rejected_within: int | None
    memories: int
    reconfirmed: int
    touches: int


@dataclass(frozen=True, slots=True)
class HorizonFigures:
    """Within `days` of their creation, among the memories at least that old (`cohort`)."""

    days: int
    cohort: int = 0
    rejected: dict[Rejection, int] = field(default_factory=lambda: dict.fromkeys(Rejection, 0))

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def rejected_rate(self) -> float | None:
        """None while the cohort is empty: no memory of the model is old enough to tell."""
        return self.rejected_total / self.cohort if self.cohort else None


@dataclass(frozen=True, slots=True)
class ModelQuality:
    model: str
    created: int
    reconfirmed: int
    touches: int
    horizons: tuple[HorizonFigures, ...]

    @property
    def reconfirmed_rate(self) -> float | None:
        return self.reconfirmed / self.created if self.created else None


def summarize(cells: Iterable[Cell], max_models: int = MAX_MODELS) -> list[ModelQuality]:
    """One entry per model, most memories first; past `max_models`, the rest summed as OTHER_MODELS."""
    by_model: dict[str, list[Cell]] = {}
    for cell in cells:
        by_model.setdefault(cell.model or NO_MODEL, []).append(cell)
    ranked = sorted(by_model.items(), key=lambda item: (-sum(c.memories for c in item[1]), item[0]))
    kept = [(name, group) for name, group in ranked[:max_models]]
    rest = [c for _, group in ranked[max_models:] for c in group]
    if rest:
        kept.append((OTHER_MODELS, rest))
    return [_figures(name, group) for name, group in kept]


def _figures(model: str, cells: list[Cell]) -> ModelQuality:
    horizons = []
    for days in HORIZONS_DAYS:
        cohort = [c for c in cells if c.matured_days >= days]
        figures = HorizonFigures(days, sum(c.memories for c in cohort))
        for c in cohort:
            if c.rejection is not None and c.rejected_within is not None and c.rejected_within <= days:
                figures.rejected[c.rejection] += c.memories
        horizons.append(figures)
    return ModelQuality(
        model,
        created=sum(c.memories for c in cells),
        reconfirmed=sum(c.reconfirmed for c in cells),
        touches=sum(c.touches for c in cells),
        horizons=tuple(horizons),
    )
