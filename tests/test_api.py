"""The Python API for notebooks: Results.requests arrays and Results.to_pandas()."""

from __future__ import annotations

import numpy as np
import pytest

import servesim


@pytest.fixture(scope="module")
def results():
    return servesim.simulate(
        servesim.load_scenario(None, ["workload.requests=200", "slo={standard: {ttft: 50ms}}"])
    )


def test_to_pandas_matches_the_summary(results):
    df = results.to_pandas()
    assert len(df) == results.summary["injected_requests"] == 200
    assert df.index.name == "id" and list(df.index) == list(range(200))
    done = df[df.status == "completed"]
    assert len(done) == results.summary["completed_requests"]
    # the summary's percentiles interpolate the same way as pandas' default
    assert done.ttft_ms.quantile(0.99) == pytest.approx(results.summary["ttft_p99_ms"])
    assert done.e2e_ms.mean() == pytest.approx(results.summary["e2e_mean_ms"])
    assert done.tpot_ms.mean() == pytest.approx(results.summary["tpot_mean_ms"])
    assert set(df.slo_class) == {"standard"}


def test_to_pandas_agrees_with_the_arrays(results):
    df = results.to_pandas()
    r = results.requests
    np.testing.assert_array_equal(df.prompt_tokens.to_numpy(), r["prompt_tokens"])
    np.testing.assert_array_equal(df.arrival_us.to_numpy(), r["arrival_us"])
