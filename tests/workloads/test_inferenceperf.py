"""`servesim convert inference-perf`: golden conversions, runs of the results, refusals by name.

The golden files under data/inference_perf/ were written by this converter and checked by hand
against the mapping table in servesim/workloads/inferenceperf.py's docstring (inference-perf's
field names and defaults as its config models declare them: Distribution min 10 / max 1024 /
mean 512 / std_dev 200 / type normal; load interval 1 s; shared_prefix num_groups 10).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim import ScenarioError, load_scenario, simulate
from servesim.cli import main
from servesim.simcore.config import load_yaml
from servesim.simcore.rng import RandomStreams
from servesim.workloads.inferenceperf import convert_inference_perf
from servesim.workloads.spec import workload_from_config

DATA = Path(__file__).parent / "data" / "inference_perf"
GOLDEN = ["shared_prefix", "random_constant", "concurrent"]


@pytest.mark.parametrize("name", GOLDEN)
def test_conversion_matches_its_golden_file(name, tmp_path, capsys):
    out = tmp_path / f"{name}.yaml"
    code = main(["convert", "inference-perf", "--spec", str(DATA / f"{name}.yaml"), "-o", str(out)])
    assert code == 0
    assert out.read_text(encoding="utf-8") == (DATA / f"{name}.expected.yaml").read_text(
        encoding="utf-8"
    )
    assert f"wrote {out}" in capsys.readouterr().out


def test_conversion_prints_to_stdout_without_a_destination(capsys):
    assert main(["convert", "inference-perf", "--spec", str(DATA / "concurrent.yaml")]) == 0
    assert capsys.readouterr().out == (DATA / "concurrent.expected.yaml").read_text("utf-8")


@pytest.mark.parametrize("name", GOLDEN)
def test_converted_workloads_run_and_audit_clean(name):
    sections = load_yaml((DATA / f"{name}.expected.yaml").read_text(encoding="utf-8"))
    sections["workload"]["requests"] = 60
    results = simulate(load_scenario({"model": "qwen3-14b", **sections}))
    assert results.summary["completed_requests"] == 60


def test_stages_and_gaps_keep_the_offered_load():
    """Two 60 s stages at 2 and 4 req/s with a 5 s gap: 360 requests expected over 125 s."""
    sections, _ = convert_inference_perf(
        load_yaml((DATA / "shared_prefix.yaml").read_text("utf-8"))
    )
    workload = workload_from_config(sections["workload"])
    arrivals = [r.arrival_us for r in workload.requests(RandomStreams(sections["seed"]))]
    assert 300 < len(arrivals) < 420  # Poisson: 360 ± 3.2 sigma
    assert not [t for t in arrivals if 60e6 < t < 65e6]  # the idle interval
    assert max(arrivals) <= 125e6


def _config(**overrides):
    base = {
        "load": {"type": "poisson", "stages": [{"rate": 1, "duration": 10}]},
        "data": {"type": "random"},
    }
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        base[section] = {**base[section], field: value} if field else value
    return base


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"data__type": "shareGPT"}, "data.type", "dataset servesim does not read"),
        ({"data__type": "mock"}, "data.type", "expected random, synthetic or shared_prefix"),
        ({"load__type": "trace_replay"}, "load.type", "servesim run --trace"),
        ({"load__sweep": {"type": "linear"}}, "load.sweep", "live server"),
        ({"load__stages": []}, "load.stages", "non-empty list"),
        ({"load__stages": [{"rate": 1}]}, "load.stages[0].duration", "missing"),
        ({"load__stages": [{"rate": -1, "duration": 5}]}, "load.stages[0].rate", "greater than 0"),
        ({"load__stagess": []}, "load", "stages"),
        (
            {"data__input_distribution": {"type": "skew_normal"}},
            "data.input_distribution.type",
            "skew",
        ),
        (
            {"data__input_distribution": {"min": 50, "max": 10}},
            "data.input_distribution.min",
            "max",
        ),
        (
            {
                "load": {
                    "type": "concurrent",
                    "stages": [
                        {"num_requests": 5, "concurrency_level": 2},
                        {"num_requests": 5, "concurrency_level": 4},
                    ],
                }
            },
            "load.stages",
            "one stage at a time",
        ),
        (
            {"data": {"type": "shared_prefix", "shared_prefix": {"enable_multi_turn_chat": True}}},
            "data.shared_prefix.enable_multi_turn_chat",
            "sessions",
        ),
    ],
)
def test_unconvertible_fields_are_refused_by_name(overrides, field, words):
    with pytest.raises(ScenarioError) as err:
        convert_inference_perf(_config(**overrides))
    assert f"inference-perf.{field}" in str(err.value)
    assert words in str(err.value)


def test_the_cli_names_a_missing_spec_file(tmp_path, capsys):
    code = main(["convert", "inference-perf", "--spec", str(tmp_path / "nope.yaml")])
    assert code == 2
    assert "--spec" in capsys.readouterr().err
