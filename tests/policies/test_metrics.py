"""Control-plane metrics (spec §7.4): Jain's index, goodput against a hand-computed example, and
per-class latency."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesim.analysis.metrics import percentile as results_percentile
from servesim.policies.metrics import goodput, jain_index, per_class_latency, percentile


@pytest.mark.parametrize(
    "values,expected",
    [
        ([5, 5, 5, 5], 1.0),
        ([1, 0, 0, 0], 0.25),
        ([1, 2, 3], 36 / 42),
        ([0, 0, 0], 1.0),
        ([], 0.0),
        ([7], 1.0),
    ],
)
def test_jain_index(values, expected):
    assert jain_index(np.array(values, dtype=float)) == pytest.approx(expected)


def test_percentile_matches_the_results_module():
    for n in (0, 1, 2, 7, 100):
        values = np.sort(np.random.default_rng(n).random(n))
        for p in (0, 50, 90, 99, 100):
            assert percentile(values, p) == results_percentile(values, p)


# Eight requests: two classes with targets, one without (ignored by goodput).
#   id  class        completed ttft  itl   e2e
#   0   critical     yes       50    10    400     good
#   1   critical     yes       150   10    500     ttft miss
#   2   critical     yes       80    nan   90      good (no ITL gap)
#   3   critical     no        -     -     -       (rejected)
#   4   (empty)      yes       900   40    5000    good for default (e2e ≤ 6000, ttft ≤ 1000)
#   5   default      yes       1200  40    5000    ttft miss
#   6   default      yes       100   30    7000    e2e miss
#   7   batch        yes       1     1     1       no targets
TTFT = [50, 150, 80, np.nan, 900, 1200, 100, 1]
ITL = [10, 10, np.nan, np.nan, 40, 40, 30, 1]
E2E = [400, 500, 90, np.nan, 5000, 5000, 7000, 1]
DONE = [True, True, True, False, True, True, True, True]
NAMES = ["critical", "", "default", "batch"]
CODES = [0, 0, 0, 0, 1, 2, 2, 3]
TARGETS = {
    "critical": {"ttft_ms": 100, "itl_ms": 20, "e2e_ms": None},
    "default": {"ttft_ms": 1000, "e2e_ms": 6000},
}
INJECTED = {"critical": 5, "": 1, "default": 2, "batch": 1}  # one critical dropped before the table


def test_goodput_against_a_hand_computed_example():
    out = goodput(
        TTFT, ITL, E2E, DONE, CODES, TARGETS, INJECTED, duration_s=10.0, class_names=NAMES
    )
    crit, default = out["per_class"]["critical"], out["per_class"]["default"]
    assert list(out["per_class"]) == ["critical", "default"]
    assert (crit["good"], crit["completed"], crit["count"]) == (2, 3, 5)
    assert crit["slo_attainment"] == pytest.approx(2 / 5)
    assert crit["goodput_rps"] == pytest.approx(0.2)
    assert crit["slo_attainment_by_dim"] == pytest.approx({"ttft_ms": 2 / 3, "itl_ms": 1.0})
    assert crit["tpot_mean_ms"] == pytest.approx(10.0)
    assert crit["ttft_p99_ms"] == pytest.approx(80 + 0.98 * 70)
    assert crit["e2e_p99_ms"] == pytest.approx(400 + 0.98 * 100)
    assert (default["good"], default["completed"], default["count"]) == (1, 3, 3)
    assert default["slo_attainment_by_dim"] == pytest.approx({"ttft_ms": 2 / 3, "e2e_ms": 2 / 3})
    assert out["good"] == 3 and out["injected"] == 8
    assert out["slo_attainment"] == pytest.approx(3 / 8)
    assert out["goodput_rps"] == pytest.approx(0.3)


def test_goodput_accepts_class_names_directly():
    labels = [NAMES[c] for c in CODES]
    by_code = goodput(TTFT, ITL, E2E, DONE, CODES, TARGETS, INJECTED, 10.0, class_names=NAMES)
    by_name = goodput(TTFT, ITL, E2E, DONE, labels, TARGETS, INJECTED, 10.0)
    assert by_code == by_name


def test_goodput_without_targets_or_injections_is_zero_not_an_error():
    out = goodput([], [], [], [], [], {}, {}, 0.0)
    assert out == {
        "slo_attainment": 0.0,
        "goodput_rps": 0.0,
        "good": 0,
        "injected": 0,
        "per_class": {},
    }
    out = goodput([1.0], [1.0], [1.0], [True], ["x"], {"y": {"ttft_ms": 5}}, {}, 1.0)
    assert out["per_class"]["y"]["slo_attainment"] == 0.0


def test_goodput_rejects_unknown_target_dimensions_and_mismatched_arrays():
    with pytest.raises(ValueError, match="tpot"):
        goodput([1.0], [1.0], [1.0], [True], ["a"], {"a": {"tpot_ms": 5}}, {"a": 1}, 1.0)
    with pytest.raises(ValueError, match="one entry per request"):
        goodput([1.0, 2.0], [1.0], [1.0], [True], ["a"], {}, {}, 1.0)


def test_per_class_latency_gives_mean_p50_p99_per_completed_class():
    out = per_class_latency(TTFT, ITL, E2E, DONE, CODES, class_names=NAMES)
    assert list(out) == ["batch", "critical", "default"]
    crit = out["critical"]
    assert crit["count"] == 3
    assert crit["ttft_mean_ms"] == pytest.approx(280 / 3)
    assert crit["ttft_p50_ms"] == pytest.approx(80)
    assert crit["ttft_p99_ms"] == pytest.approx(80 + 0.98 * 70)
    assert crit["tpot_mean_ms"] == pytest.approx(10) and crit["tpot_p99_ms"] == pytest.approx(10)
    default = out["default"]
    assert default["count"] == 3 and default["e2e_p50_ms"] == pytest.approx(5000)
    assert default["tpot_mean_ms"] == pytest.approx(110 / 3)
    assert "itl_p99_ms" not in default  # every-gap percentiles are not recorded per class


def test_per_class_itl_mean_is_over_every_gap_like_the_top_level_one():
    # two requests of one class: 3 gaps of 10 ms and 1 gap of 40 ms -> every gap: 70/4 = 17.5,
    # per request (TPOT): (10 + 40)/2 = 25
    out = per_class_latency(
        [1.0, 1.0], [10.0, 40.0], [5.0, 5.0], [True, True], ["a", "a"], gaps=[3, 1]
    )
    assert out["a"]["itl_mean_ms"] == pytest.approx(17.5)
    assert out["a"]["tpot_mean_ms"] == pytest.approx(25.0)
    assert not any(math.isnan(v) for row in out.values() for v in row.values())
