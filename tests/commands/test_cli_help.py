"""Conventions of the command line: ``--version``, and ``--help`` of every verb with examples and a help line
for every option (through argparse itself: the parser users get)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from kilocard import __version__, commands
from kilocard.commands import COMMANDS, build_parser, parse_args


def subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        commands.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"kilocard {__version__}"


@pytest.mark.parametrize("verb", list(COMMANDS))
def test_every_verb_help_shows_examples_and_every_option_has_help(verb, capsys):
    parser = subparsers()[verb]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and action.help.strip(), (
            f"kilocard {verb}: {action.option_strings or action.dest} has no help"
        )
    with pytest.raises(SystemExit) as e:
        commands.main([verb, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "examples:\n  kilocard " + verb in out, out


@pytest.mark.parametrize(("verb", "example"), [(v, e) for v, m in COMMANDS.items() for e in m.EXAMPLES])
def test_every_help_example_parses(verb, example):
    """Each example is a command line the parser takes as is (shell redirections aside)."""
    words = shlex.split(example.split(" > ")[0])
    assert words[:2] == ["kilocard", verb]
    assert parse_args(words[1:]).verb == verb
