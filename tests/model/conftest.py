"""The integration fixtures (handler factory, metrics, scripted model client) for the real-model run."""

from tests.integration.conftest import llm_client, make_handler, metrics  # noqa: F401
