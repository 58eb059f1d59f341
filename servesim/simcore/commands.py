"""Sub-commands of a command line, declared once: name, texts, arguments and the function to run.

Every sub-command used to repeat the same few steps: add a parser with its help and description,
add its arguments, name its handler, return the parser. :class:`Command` holds what differs and
does those steps in one place; calling it with argparse's ``subparsers`` adds the command, so a
module exposes ``add_<name>_parser = Command(...)`` where it used to write the function.

:func:`given_options` is the other step every command repeats: the options that were given on the
command line, as the configuration fields they set.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Command", "given_options"]


@dataclass(frozen=True)
class Command:
    """One sub-command. ``arguments`` adds its positionals and options to the parser it is given;
    ``handler`` runs the parsed arguments and returns the exit code (the top-level ``main`` calls
    ``args.handler(args)``)."""

    name: str
    help: str
    description: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]

    def __call__(self, subparsers: Any) -> argparse.ArgumentParser:
        """Add the command to ``subparsers`` (what ``add_subparsers`` returned); return its parser."""
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description)
        self.arguments(parser)
        parser.set_defaults(handler=self.handler)
        return parser


def given_options(args: argparse.Namespace, fields: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``{field: value}`` for each ``(dest, field)`` pair whose option was given (is not None),
    in the order of ``fields``: the overrides a command's options make."""
    values = ((field, getattr(args, dest)) for dest, field in fields)
    return {field: value for field, value in values if value is not None}
