"""servesim's log lines: ``level: sentence (key=value ...)``, filtered by level, to a stream."""

from __future__ import annotations

import io

import pytest

from servesim.simcore.log import configure, errors_only, get_logger


@pytest.fixture
def stream():
    out = io.StringIO()
    configure("info", out)
    yield out
    configure("warning")


def test_a_line_names_its_level_sentence_and_bound_context(stream):
    get_logger("servesim.test", instance=3).bind(sim_time=7).warning("queue full", depth=9)
    assert stream.getvalue() == "warning: queue full (instance=3 sim_time=7 depth=9)\n"


def test_lines_below_the_level_are_dropped(stream):
    get_logger("servesim.test").debug("not shown")
    get_logger("servesim.test").info("shown")
    configure("error", stream)
    get_logger("servesim.test").warning("not shown either")
    get_logger("servesim.test").error("shown too")
    assert stream.getvalue() == "info: shown\nerror: shown too\n"


def test_errors_only_silences_warnings_inside_the_block_only(stream):
    with errors_only():
        get_logger("servesim.test").warning("hidden")
        get_logger("servesim.test").error("kept")
    get_logger("servesim.test").warning("after")
    assert stream.getvalue() == "error: kept\nwarning: after\n"


def test_an_unknown_level_is_refused_naming_the_levels():
    with pytest.raises(ValueError, match="debug, info, warning, error"):
        configure("verbose")
