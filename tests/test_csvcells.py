"""simcore.csvcells: one CSV cell read as a number, with an error naming the column."""

from __future__ import annotations

import pytest

from servesim.simcore.csvcells import BadCell, cell_finite, cell_number, cell_whole


@pytest.mark.parametrize(
    ("text", "kwargs", "value"),
    [
        ("2.5", {}, 2.5),
        ("0", {}, 0.0),
        ("1e3", {}, 1000.0),
        (" 7 ", {}, 7.0),
        ("3", {"minimum": 3}, 3.0),
    ],
)
def test_a_number_cell_is_read(text, kwargs, value):
    assert cell_number(text, "c", **kwargs) == value


@pytest.mark.parametrize(
    ("text", "kwargs", "what"),
    [
        ("", {}, "expected a number"),
        ("ten", {}, "expected a number"),
        ("nan", {}, "finite"),
        ("inf", {}, "finite"),
        ("-1", {}, "must be >= 0"),
        ("0", {"strict": True}, "must be > 0"),
        ("2", {"minimum": 3}, "must be >= 3"),
    ],
)
def test_a_bad_number_cell_names_its_column_and_what_is_allowed(text, kwargs, what):
    with pytest.raises(BadCell) as err:
        cell_number(text, "ttft_s", **kwargs)
    assert err.value.column == "ttft_s" and err.value.value == text and what in err.value.what
    assert isinstance(err.value, ValueError)


def test_a_below_minimum_error_can_name_the_fix():
    with pytest.raises(BadCell, match=r"must be >= 0 \(leave the cell empty when unknown\)"):
        cell_number("-0.1", "ttft_s", hint="leave the cell empty when unknown")


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), ("12.0", 12), ("1e3", 1000), ("12345678901234567890", 12345678901234567890)],
)
def test_a_whole_number_cell_is_read_exactly(text, value):
    assert cell_whole(text, "c") == value


@pytest.mark.parametrize(
    ("text", "minimum", "what"),
    [
        ("1.5", 0, "expected a whole number"),
        ("x", 0, "expected a whole number"),
        ("inf", 0, "expected a whole number"),
        ("-2", 0, "must not be negative"),
        ("0", 1, "must be at least 1"),
    ],
)
def test_a_bad_whole_number_cell_says_what_is_allowed(text, minimum, what):
    with pytest.raises(BadCell, match=what):
        cell_whole(text, "input_tokens", minimum=minimum)


@pytest.mark.parametrize(
    ("text", "kwargs", "what"),
    [
        ("x", {}, "expected a number"),
        ("nan", {}, "expected a finite number"),
        ("-inf", {"not_finite": "no infinity here"}, "no infinity here"),
    ],
)
def test_cell_finite_names_the_column_and_says_what_is_wrong(text, kwargs, what):
    with pytest.raises(BadCell) as err:
        cell_finite(text, "time_s", **kwargs)
    assert (err.value.column, err.value.value, err.value.what) == ("time_s", text, what)


def test_cell_finite_accepts_negative_and_exponent_forms():
    assert cell_finite("-2.5", "c") == -2.5
    assert cell_finite("1e3", "c") == 1000.0
