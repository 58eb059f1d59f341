"""structlog configuration: one human line per event on stderr, filtered by level.

A line reads ``warning: <sentence> (key=value ...)``: the event is a sentence, the bound
context follows in parentheses.

Library code logs through :func:`get_logger` and binds context (``sim_time`` and the ids of
the things involved); nothing logs inside a hot loop. The CLI calls :func:`configure` with
``--log-level``; a library user who never calls it gets warnings only.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error")
_configured = False


def configure(level: str = "warning", stream: TextIO | None = None) -> None:
    """Route servesim's logs to ``stream`` (stderr by default) at ``level`` and above."""
    global _configured
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            _human_line,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=(lambda *args: _LateStderr())
        if stream is None
        else structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    _configured = True


def _human_line(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    """``level: sentence (key=value ...)``."""
    level = event.pop("level", method)
    text = str(event.pop("event", ""))
    context = " ".join(f"{key}={value}" for key, value in event.items())
    return f"{level}: {text}" + (f" ({context})" if context else "")


class _LateStderr:
    """Writes to whatever ``sys.stderr`` is when a message is logged (test runners swap it)."""

    def msg(self, message: str) -> None:
        try:
            print(message, file=sys.stderr, flush=True)
        except ValueError:  # a closed stream: a log line is never worth failing a run
            return

    log = debug = info = warning = warn = error = critical = exception = msg


def get_logger(name: str, **context):
    """A bound logger for ``name``; configures the warning-level default on first use."""
    if not _configured:
        configure()
    return structlog.get_logger(name).bind(**context)


@contextlib.contextmanager
def errors_only() -> Iterator[None]:
    """Only errors are logged inside the block (a fit replaying the same runs a hundred times
    repeats the first replay's warnings otherwise); the configuration is restored after."""
    if not _configured:
        configure()
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    try:
        yield
    finally:
        structlog.configure(**saved)
