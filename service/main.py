"""`mao-memory`, the console script: the one module above the composition root, which it hands to
the CLI's commands (`service.entrypoints.cli`)."""

from __future__ import annotations

from service.entrypoints import cli


def main(argv: list[str] | None = None) -> None:
    cli.run(argv, _composition_root)


def _composition_root() -> cli.CompositionRoot:
    """Imported only when a command needs it, so `dev-token` and `migrate` stay light."""
    from service import bootstrap

    return bootstrap


if __name__ == "__main__":
    main()
