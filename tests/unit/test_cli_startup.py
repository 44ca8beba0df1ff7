"""The configuration does not pull in the model client (so commands that call no model start fast):
its structured-output setting restates the client's modes, and this keeps them equal."""

from __future__ import annotations

from typing import get_args

from service.adapters.llm_client import StructuredOutput
from service.config import Settings


def test_the_structured_output_setting_takes_exactly_the_clients_modes() -> None:
    annotation = Settings.model_fields["llm_structured_output"].annotation
    assert set(get_args(annotation)) == {mode.value for mode in StructuredOutput}
