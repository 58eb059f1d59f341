"""structlog configuration: one human line per event on stderr, filtered by level.

A line reads ``warning: <sentence> (key=value ...)``: the event is a sentence, the bound
context follows in parentheses.

Library code logs through :func:`get_logger` and binds context (``sim_time`` and the ids of
the things involved); nothing logs inside a hot loop. The CLI calls :func:`configure` with
``--log-level``; a library user who never calls it gets warnings only.

structlog (and asyncio, which it imports) is loaded only when a line at an enabled level is
first logged: a run that logs nothing, the usual case, starts without paying for it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
_NUMBERS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
"""The standard library's logging numbers of :data:`LEVELS`."""

_level = "warning"
_stream: TextIO | None = None
_threshold = _NUMBERS[_level]
"""Lines below this number are dropped before structlog is asked (or loaded)."""
_configured = False
"""Whether structlog has been configured with the settings above."""


def configure(level: str = "warning", stream: TextIO | None = None) -> None:
    """Route servesim's logs to ``stream`` (stderr by default) at ``level`` and above."""
    global _level, _stream, _threshold, _configured
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    _level, _stream, _threshold = level, stream, _NUMBERS[level]
    _configured = False
    if "structlog" in sys.modules:  # already paid for: configure now, as callers expect
        _apply()


def _apply() -> None:
    """Configure structlog with the settings of the last :func:`configure` call."""
    global _configured
    import logging

    import structlog

    stream = _stream
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            _human_line,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, _level.upper())),
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


class _Logger:
    """A bound logger that asks structlog only for a line at an enabled level: a filtered call
    costs a comparison, and structlog is imported (and configured) by the first line that passes."""

    __slots__ = ("_name", "_context")

    def __init__(self, name: str, context: dict[str, Any]):
        self._name = name
        self._context = context

    def bind(self, **context: Any) -> _Logger:
        return _Logger(self._name, {**self._context, **context})

    def _log(self, level: str, event: str, fields: dict[str, Any]) -> Any:
        if _NUMBERS[level] < _threshold:
            return None
        if not _configured:
            _apply()
        import structlog

        logger = structlog.get_logger(self._name).bind(**self._context)
        return getattr(logger, level)(event, **fields)

    def debug(self, event: str, **fields: Any) -> Any:
        return self._log("debug", event, fields)

    def info(self, event: str, **fields: Any) -> Any:
        return self._log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> Any:
        return self._log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> Any:
        return self._log("error", event, fields)


def get_logger(name: str, **context: Any) -> _Logger:
    """A bound logger for ``name``; the warning-level default applies until :func:`configure`.

    When structlog is already loaded (a test about to capture logs), it is configured here, as
    it always was on first use, so a later capture is not overridden by the first line logged.
    """
    if not _configured and "structlog" in sys.modules:
        _apply()
    return _Logger(name, context)


@contextlib.contextmanager
def errors_only() -> Iterator[None]:
    """Only errors are logged inside the block (a fit replaying the same runs a hundred times
    repeats the first replay's warnings otherwise); the configuration is restored after."""
    global _threshold
    import logging

    import structlog

    if not _configured:
        _apply()
    saved, saved_threshold = structlog.get_config(), _threshold
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    _threshold = _NUMBERS["error"]
    try:
        yield
    finally:
        structlog.configure(**saved)
        _threshold = saved_threshold
