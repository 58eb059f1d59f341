"""The collector's thresholds are spaced out during a run's event loop and put back after."""

from __future__ import annotations

import gc

import pytest

from servesim.simcore.collector import YOUNG_THRESHOLD, collections_spaced


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_young_threshold_is_raised_inside_and_restored_even_after_an_error(thresholds):
    gc.set_threshold(700, 10, 10)
    with pytest.raises(KeyboardInterrupt), collections_spaced():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        raise KeyboardInterrupt
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_or_a_disabled_one_is_left_as_it_is(thresholds):
    gc.set_threshold(10 * YOUNG_THRESHOLD, 5, 5)
    with collections_spaced():
        assert gc.get_threshold() == (10 * YOUNG_THRESHOLD, 5, 5)
    gc.set_threshold(0, 10, 10)  # 0 switches automatic collection off: it stays off
    with collections_spaced():
        assert gc.get_threshold() == (0, 10, 10)


def test_a_run_restores_the_thresholds_it_found(thresholds):
    import servesim

    gc.set_threshold(900, 11, 12)
    servesim.simulate(servesim.load_scenario(None, ["workload.requests=50", "workload.rate=5"]))
    assert gc.get_threshold() == (900, 11, 12)
