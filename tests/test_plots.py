"""Figures and the HTML report of a run (servesim.analysis.plots, servesim.analysis.report).

Each figure is built from a small real run (≤ 300 requests, simulated and written here): it has a
title, labelled axes with units and a legend; it refuses runs it does not apply to with a
ScenarioError that says why; ``save_all`` writes the PNG files and skips what does not apply; the
Gantt shows exactly the steps in its window; the report is one self-contained HTML page; missing
files and missing matplotlib give errors that name the file and the fix; the CLI handlers work
from argparse namespaces.
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import servesim  # noqa: E402
from servesim.analysis.accessor import PlotAccessor  # noqa: E402
from servesim.analysis.metrics import weighted_percentile  # noqa: E402
from servesim.analysis.plots import (  # noqa: E402
    FIGURES,
    FigureNotApplicable,
    ResultsData,
    add_plot_parser,
    build_figures,
    cmd_plot,
    figure_caption,
    gateway_queue,
    instance_timeseries,
    latency_cdfs,
    latency_over_time,
    parse_window,
    save_all,
    step_gantt,
    transfer_timeline,
)
from servesim.analysis.report import add_report_parser, cmd_report, write_report  # noqa: E402
from servesim.simcore.errors import ScenarioError  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNIT = re.compile(r"\((ms|s|%|requests|tokens|transfers|fraction|×)\)|per [\d.]+ s")


def _run(tmp_path_factory, name: str, source, overrides: list[str]) -> Path:
    results = servesim.simulate(servesim.load_scenario(source, overrides))
    return results.write(tmp_path_factory.mktemp(name) / "run")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    """The default scenario (one instance, one SLO class), 150 requests."""
    return _run(tmp_path_factory, "default", None, ["workload.requests=150"])


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory) -> Path:
    """Flow control under overload (three SLO classes; rejections, shedding, expiry)."""
    return _run(
        tmp_path_factory,
        "flow",
        str(EXAMPLES / "flow-control-overload.yaml"),
        ["workload.requests=300", "engine.max_num_seqs=40"],
    )


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory) -> Path:
    """Prefill/decode disaggregation: 2 prefill + 2 decode instances, 40 requests."""
    return _run(
        tmp_path_factory,
        "pd",
        str(EXAMPLES / "pd-disaggregation.yaml"),
        ["workload.requests=40", "workload.rate=8"],
    )


@pytest.fixture(scope="module")
def default_data(default_run) -> ResultsData:
    return ResultsData.load(default_run)


@pytest.fixture(scope="module")
def flow_data(flow_run) -> ResultsData:
    return ResultsData.load(flow_run)


@pytest.fixture(scope="module")
def pd_data(pd_run) -> ResultsData:
    return ResultsData.load(pd_run)


def check_figure(fig, *, min_axes: int = 1) -> list:
    """The figure has a title, every panel a title, units on its labels and a legend."""
    assert fig._suptitle is not None and fig._suptitle.get_text().strip()
    assert figure_caption(fig)
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(axes) >= min_axes
    for ax in axes:
        ylabel = ax.get_ylabel()
        assert ylabel, f"panel {ax.get_title()!r} has no y label"
        if ax.get_xlabel():
            assert UNIT.search(ax.get_xlabel()), ax.get_xlabel()
    # every panel with a plotted series says what it is (twin axes share the host's legend)
    for ax in axes:
        if ax.get_legend() is None:
            assert not ax.get_title() or not ax.get_legend_handles_labels()[0], ax.get_title()
    assert any(UNIT.search(ax.get_xlabel()) for ax in axes), "no x axis with units"
    return axes


# ---------------------------------------------------------------------- loading and ITL


def test_loader_reads_every_file(default_data, pd_data):
    assert default_data.summary["completed_requests"] == 150
    assert len(default_data.requests["id"]) == 150
    assert default_data.steps is not None and "i0_start_us" in default_data.steps
    assert default_data.transfers is None and not default_data.is_pd
    assert pd_data.is_pd and len(pd_data.transfers["start_s"]) == 40
    assert pd_data.role(0) == "prefill" and pd_data.role(3) == "decode"


def test_itl_rebuilt_from_the_step_log_matches_the_summary(default_data):
    itl = default_data.itl()
    assert itl.exact
    s = default_data.summary
    assert int(itl.weights.sum()) == s["itl_gaps"]
    for p in (50, 90, 99):
        assert weighted_percentile(itl.values_ms, itl.weights, p) == pytest.approx(
            s[f"itl_p{p}_ms"], abs=1e-6
        )


def _alpha_scenario(**cluster) -> dict:
    return {
        "seed": 3,
        "latency": {"model": "blackbox", "alpha": [1000, 0.1, 700], "beta": [5000, 20, 15]},
        "workload": {"preset": "chatbot", "rate": 30, "requests": 60},
        "cluster": cluster or {"instances": 2},
    }


def test_itl_recovers_a_nonzero_alpha2():
    results = servesim.simulate(servesim.load_scenario(_alpha_scenario()))
    itl = PlotAccessor(results).data.itl()
    assert itl.exact and itl.alpha2_us == 700
    assert weighted_percentile(itl.values_ms, itl.weights, 99) == pytest.approx(
        results.summary["itl_p99_ms"], abs=1e-6
    )


def test_itl_falls_back_to_tpot_when_instances_differ_in_alpha2():
    other = {"model": "blackbox", "alpha": [1000, 0.1, 2500], "beta": [5000, 20, 15]}
    data = _alpha_scenario(groups=[{"count": 1}, {"count": 1, "latency": other}])
    results = servesim.simulate(servesim.load_scenario(data))
    accessor = PlotAccessor(results)
    itl = accessor.data.itl()
    assert not itl.exact and "TPOT" in itl.label
    fig = accessor.latency_cdfs()
    assert "TPOT" in fig.axes[1].get_xlabel()
    assert "TPOT" in figure_caption(fig)


# ---------------------------------------------------------------------- figures


def test_latency_cdfs(flow_data):
    fig = latency_cdfs(flow_data)
    axes = check_figure(fig, min_axes=3)
    assert [ax.get_title() for ax in axes] == [
        "Time to first token",
        "Inter-token latency",
        "End-to-end latency",
    ]
    assert all("(ms)" in ax.get_xlabel() for ax in axes)
    labels = axes[0].get_legend_handles_labels()[1]
    for cls in ("critical", "standard", "sheddable"):
        assert any(label.startswith(f"{cls} (n=") for label in labels), labels
    assert any("target 500 ms" in label for label in labels)  # critical's TTFT target
    # each CDF ends at 1
    for line in axes[0].get_lines():
        ydata = np.asarray(line.get_ydata(), dtype=float)
        if len(ydata) > 2 and line.get_label().endswith(")"):
            assert ydata[-1] == pytest.approx(1.0)


def test_latency_over_time(flow_data):
    axes = check_figure(latency_over_time(flow_data), min_axes=3)
    assert [ax.get_ylabel() for ax in axes] == ["TTFT (ms)", "TPOT (ms)", "E2E latency (ms)"]
    assert axes[-1].get_xlabel() == "arrival time (s)"
    labels = axes[0].get_legend_handles_labels()[1]
    assert any(label.startswith("not completed (") for label in labels)


def test_instance_timeseries(pd_data):
    fig = instance_timeseries(pd_data)
    axes = check_figure(fig, min_axes=3)
    assert axes[2].get_ylabel() == "KV blocks in use (%)"
    labels = axes[0].get_legend_handles_labels()[1]
    assert labels == [
        "instance 0 (prefill)",
        "instance 1 (prefill)",
        "instance 2 (decode)",
        "instance 3 (decode)",
    ]
    kv = np.concatenate([np.asarray(line.get_ydata()) for line in axes[2].get_lines()])
    assert kv.min() >= 0 and 0 < kv.max() <= 100


def test_gateway_queue_is_derived_and_bounded_by_the_recorded_peak(flow_data):
    fig = gateway_queue(flow_data)
    axes = check_figure(fig, min_axes=2)
    assert "derived" in axes[0].get_title() and "derived" in figure_caption(fig).lower()
    total = next(line for line in axes[0].get_lines() if line.get_label() == "all classes")
    depth = np.asarray(total.get_ydata())
    peak = flow_data.summary["anomalies"]["gateway_peak_depth"]
    assert depth.min() >= 0 and 0 < depth.max() <= peak
    refused = axes[1].get_legend_handles_labels()[1]
    s = flow_data.summary
    assert f"rejected (full queue or admission): {s['rejected_requests']}" in refused
    assert any(
        label.startswith(f"expired (waited the ttl): {s['expired_requests']}") for label in refused
    )


def test_gateway_queue_needs_flow_control(default_data):
    with pytest.raises(FigureNotApplicable, match="policies.flow_control"):
        gateway_queue(default_data)


def test_transfer_timeline(pd_data):
    fig = transfer_timeline(pd_data)
    axes = check_figure(fig, min_axes=3)
    assert axes[2].get_ylabel() == "transfer duration (ms)"
    durations = np.concatenate([np.asarray(c.get_offsets())[:, 1] for c in axes[2].collections])
    assert len(durations) == 2 * 40  # each transfer's duration and its uncontended time


def test_transfer_timeline_needs_a_disaggregated_run(default_data):
    with pytest.raises(ScenarioError, match="not disaggregated"):
        transfer_timeline(default_data)


def test_gantt_shows_exactly_the_steps_in_its_window(default_data):
    log = default_data.step_log(0)
    starts, ends = log["start_us"] / 1e6, (log["start_us"] + log["dt_us"]) / 1e6
    fig = step_gantt(default_data, 0, 2.0, 2.5)
    axes = check_figure(fig, min_axes=2)
    assert axes[0].get_xlim() == pytest.approx((2.0, 2.5))
    expected = int(((ends > 2.0) & (starts < 2.5)).sum())
    prefill, decode = axes[0].collections[:2]
    assert len(prefill.get_paths()) == expected > 0
    xs = np.concatenate([p.vertices[:, 0] for p in prefill.get_paths()])
    assert xs.max() <= ends[starts < 2.5].max() and xs.min() >= starts[ends > 2.0].min()
    assert f"({expected} steps)" in fig._suptitle.get_text()


def test_gantt_caps_the_steps_it_draws(default_data):
    fig = step_gantt(default_data, 0, 0.0, 5.0, max_steps=10)
    assert len(fig.axes[0].collections[0].get_paths()) == 10
    assert "Capped" in figure_caption(fig)


def test_gantt_default_window_and_bad_windows(default_data):
    fig = step_gantt(default_data)
    assert "(200 steps)" in fig._suptitle.get_text()
    with pytest.raises(ScenarioError, match="no engine step"):
        step_gantt(default_data, 0, 1000.0, 1001.0)
    with pytest.raises(ScenarioError, match="after the start"):
        step_gantt(default_data, 0, 3.0, 2.0)
    with pytest.raises(ScenarioError, match="instances 0"):
        step_gantt(default_data, 7)


# ---------------------------------------------------------------------- saving and the report


def test_save_all_writes_the_figures_that_apply(default_run, tmp_path):
    out = tmp_path / "plots"
    saved = save_all(default_run, out, window=(1.0, 1.5))
    names = {p.name for p in saved}
    assert names == {
        "latency_cdfs.png",
        "latency_over_time.png",
        "instance_timeseries.png",
        "step_gantt.png",
    }
    assert set(saved.skipped) == {"gateway_queue", "transfer_timeline"}
    assert "not disaggregated" in saved.skipped["transfer_timeline"]
    for path in saved:
        assert path.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary files left


def test_report_is_self_contained(flow_run, tmp_path):
    out = write_report(flow_run, tmp_path / "report.html")
    text = out.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<script" not in text and "<link" not in text
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 5  # every figure but the transfer timeline
    assert all(base64.b64decode(image).startswith(PNG_MAGIC) for image in images)
    s = ResultsData.load(flow_run).summary
    assert f"{s['completed_requests']} of {s['injected_requests']} requests completed" in text
    assert "flow-control-overload" in text and "audit passed" in text
    assert "Per SLO class" in text and "Flow control (gateway)" in text
    assert f"{s['ttft_p99_ms']:,.1f}" in text
    assert "transfer_timeline" in text and "not disaggregated" in text  # said why it is missing
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_report_of_a_disaggregated_run(pd_run, tmp_path):
    text = write_report(pd_run, tmp_path / "pd.html").read_text(encoding="utf-8")
    assert "Prefill/decode disaggregation" in text
    assert "id='transfer_timeline'" in text


# ---------------------------------------------------------------------- errors


def test_missing_files_are_named(default_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(default_run, copy)
    (copy / "requests.csv").unlink()
    with pytest.raises(ScenarioError, match=r"requests\.csv is missing.*servesim run"):
        ResultsData.load(copy)
    with pytest.raises(ScenarioError, match="not a directory"):
        save_all(tmp_path / "nowhere", tmp_path / "out")


def test_without_steps_the_gantt_is_skipped_and_itl_uses_tpot(default_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(default_run, copy)
    (copy / "steps.npz").unlink()
    data = ResultsData.load(copy)
    figures, skipped = build_figures(data)
    assert "steps.npz" in skipped["step_gantt"] and "output.steps=true" in skipped["step_gantt"]
    assert "instance_timeseries" in figures  # drawn from timeseries.csv
    assert "timeseries.csv" in figure_caption(figures["instance_timeseries"])
    assert not data.itl().exact


def test_missing_matplotlib_says_how_to_install_it(default_data, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ScenarioError, match=r"pip install 'servesim\[plot\]'"):
        latency_cdfs(default_data)


def test_parse_window():
    assert parse_window("10:12.5") == (10.0, 12.5)
    assert parse_window(":3") == (None, 3.0)
    assert parse_window("4:") == (4.0, None)
    assert parse_window(None) == (None, None)
    for bad in ("3", "a:b", "5:1", "-1:2"):
        with pytest.raises(ScenarioError, match="--window"):
            parse_window(bad)


# ---------------------------------------------------------------------- Python API and CLI


def test_plot_accessor_from_results_and_from_a_directory(default_run):
    results = servesim.simulate(servesim.load_scenario(None, ["workload.requests=40"]))
    accessor = PlotAccessor(results)
    for fig in (
        accessor.latency_cdfs(),
        accessor.latency_over_time(),
        accessor.instances(),
        accessor.gantt(0, 0.5, 1.0),
    ):
        check_figure(fig)
    with pytest.raises(FigureNotApplicable):
        accessor.gateway()
    with pytest.raises(FigureNotApplicable):
        accessor.transfers()
    assert accessor.data.summary["completed_requests"] == 40
    assert PlotAccessor(str(default_run)).data.summary["completed_requests"] == 150


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servesim")
    sub = parser.add_subparsers(dest="command")
    add_plot_parser(sub)
    add_report_parser(sub)
    return parser


def test_cmd_plot(pd_run, tmp_path, capsys):
    args = _parser().parse_args(["plot", str(pd_run), "--instance", "2", "--window", "1:2"])
    assert args.handler is cmd_plot and args.handler(args) == 0
    printed = capsys.readouterr().out.splitlines()
    written = [Path(line) for line in printed if not line.startswith("skipped ")]
    assert sorted(written) == sorted(
        pd_run / "plots" / f"{name}.png" for name in FIGURES if name != "gateway_queue"
    )  # default: RESULTS_DIR/plots
    assert all(path.is_file() for path in written)
    assert printed[-1].startswith("skipped gateway_queue: ")
    out = tmp_path / "figs"
    args = _parser().parse_args(["plot", str(pd_run), "--out", str(out), "--instance", "9"])
    assert args.out == str(out)
    with pytest.raises(ScenarioError, match=r"^--instance: .*instances 0\.\.3"):
        cmd_plot(args)
    args = _parser().parse_args(["plot", str(pd_run), "--window", "2:1"])
    with pytest.raises(ScenarioError, match="^--window"):
        cmd_plot(args)


def test_cmd_report(default_run, tmp_path, capsys):
    args = _parser().parse_args(["report", str(default_run)])
    assert args.handler is cmd_report and args.handler(args) == 0
    assert (default_run / "report.html").is_file()
    assert str(default_run / "report.html") in capsys.readouterr().out
    args = _parser().parse_args(["report", str(default_run), "--out", str(tmp_path / "r.html")])
    assert args.out == str(tmp_path / "r.html")


def test_several_runs_overlay_on_an_axis_the_caller_owns(tmp_path):
    from matplotlib.figure import Figure

    from servesim.analysis.plots import latency_cdf_overlay

    light = servesim.simulate(
        servesim.load_scenario(None, ["workload.requests=60", "workload.rate=5"])
    )
    heavy_dir = servesim.simulate(
        servesim.load_scenario(None, ["workload.requests=60", "workload.rate=40"])
    ).write(tmp_path / "heavy")
    fig = Figure()
    ax = fig.add_subplot()
    out = latency_cdf_overlay([light, heavy_dir], "ttft", ax=ax, labels=["5 req/s", "40 req/s"])
    assert out is fig and len(ax.get_lines()) == 2
    assert [t.get_text().split(" (")[0] for t in ax.get_legend().get_texts()] == [
        "5 req/s",
        "40 req/s",
    ]
    assert ax.get_xlabel() == "TTFT (ms)"
    # its own figure when no axis is given; bad input is named
    assert latency_cdf_overlay([heavy_dir], "e2e").axes[0].get_xlabel() == "E2E latency (ms)"
    with pytest.raises(servesim.ScenarioError, match="one label per run"):
        latency_cdf_overlay([light, heavy_dir], labels=["only one"])
    with pytest.raises(servesim.ScenarioError, match="must be one of"):
        latency_cdf_overlay([light], "itl")


def test_sweep_axes_name_their_units():
    from servesim.studies.sweep.table import axis_label

    assert axis_label("workload.rate") == "workload.rate (requests/s)"
    assert axis_label("ttft_p99_ms") == "ttft_p99 (ms)"
    assert axis_label("goodput_rps") == "goodput_rps (requests/s)"
    assert axis_label("policies.routing") == "policies.routing"


def test_every_figure_draws_into_axes_the_caller_gives():
    from matplotlib.figure import Figure

    result = servesim.simulate(servesim.load_scenario(None, ["workload.requests=60"]))
    fig = Figure()
    grid = fig.subplots(2, 3)
    out = result.plot.latency_cdfs(ax=grid[0])
    assert out is fig and all(len(a.get_lines()) for a in grid[0])
    assert not fig._suptitle  # the caller's figure keeps the caller's title
    assert result.plot.instances(ax=[*grid[1]]) is fig
    with pytest.raises(servesim.ScenarioError, match="3 panel"):
        result.plot.latency_cdfs(ax=grid[1][:2])
