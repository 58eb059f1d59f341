"""The sub-command kit (simcore/commands.py): a Command adds its parser, arguments and handler;
given_options maps the options given to the fields they set."""

from __future__ import annotations

import argparse

from servesim.simcore.commands import Command, given_options


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("thing")
    p.add_argument("--count", type=int, default=1)


def _handler(args: argparse.Namespace) -> int:
    return args.count


def test_a_command_adds_its_parser_arguments_and_handler():
    command = Command(
        "greet", help="say hello", description="Say hello, at length.", arguments=_arguments,
        handler=_handler,
    )  # fmt: skip
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command")
    added = command(sub)
    assert added.description == "Say hello, at length."
    assert "say hello" in parser.format_help()
    args = parser.parse_args(["greet", "world", "--count", "3"])
    assert (args.command, args.thing) == ("greet", "world")
    assert args.handler(args) == 3


def test_given_options_keeps_the_given_values_in_table_order_and_skips_the_absent():
    args = argparse.Namespace(b=0, a="x", c=None, d=False)
    fields = (("a", "first.field"), ("b", "second"), ("c", "third"), ("d", "fourth"))
    got = given_options(args, fields)
    assert got == {"first.field": "x", "second": 0, "fourth": False}  # 0 and False were given
    assert list(got) == ["first.field", "second", "fourth"]
    assert given_options(args, ()) == {}
