"""Every subcommand's `--help` says what it does and what each of its options means. The subcommands
are read from the parser itself, so a new one is checked without being listed here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from service.entrypoints.cli import _parser


def subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from subcommands(sub, (*path, name))


COMMANDS = dict(subcommands(_parser()))


def test_the_commands_are_discovered() -> None:
    assert {("run",), ("migrate",), ("dlq",), ("dlq", "replay")} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_help_describes_the_command_and_every_option(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = COMMANDS[path]
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args([*path, "--help"])
    printed = capsys.readouterr().out
    assert exited.value.code == 0
    assert parser.description and " ".join(parser.description.split()[:4]) in " ".join(printed.split())
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):  # the one-line summary of each subcommand
            assert all(choice.help and choice.help.strip() for choice in action._choices_actions)
        elif not isinstance(action, argparse._HelpAction):
            assert action.help and action.help.strip(), f"{' '.join(path)} {action.option_strings}"
