"""One self-contained HTML page per run: ``servesim report``.

:func:`write_report` reads a results directory and writes a single HTML file with the run's
summary tables (requests, throughput, latency percentiles, per SLO class, KV cache and
preemption, flow control, disaggregation, sessions, per instance), the audit verdict, the
scenario, and every figure of :mod:`servesim.analysis.plots` that applies, embedded as base64 PNG with a
caption. The page loads nothing from elsewhere (no scripts, fonts or images by URL), so it can be
mailed or archived as it is. Needs matplotlib (``pip install 'servesim[plot]'``).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from servesim.analysis.plots.cli import add_saved_run_arguments
from servesim.analysis.plots.data import ResultsData
from servesim.analysis.plots.figure import DPI, figure_caption
from servesim.analysis.plots.saving import build_figures
from servesim.simcore.commands import Command
from servesim.simcore.errors import ScenarioError
from servesim.simcore.files import write_atomic

__all__ = ["add_report_parser", "cmd_report", "render_report", "report_html", "write_report"]

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1.5em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em;
       margin-top: 2em; } h3 { margin-bottom: 0.3em; }
.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0 1em 0; font-size: 0.92em; }
th, td { border: 1px solid #d0d0d0; padding: 0.25em 0.7em; }
th { background: #f2f2f2; text-align: left; } td.n { text-align: right;
       font-variant-numeric: tabular-nums; }
.grid { display: flex; flex-wrap: wrap; gap: 0 2.5em; align-items: flex-start; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #e0e0e0; }
figcaption { color: #444; font-size: 0.92em; max-width: 1100px; }
.pass { color: #17702a; font-weight: bold; } .fail { color: #b00020; font-weight: bold; }
.skip { color: #8a6d00; font-weight: bold; }
pre { background: #f7f7f7; border: 1px solid #e0e0e0; padding: 0.8em; overflow-x: auto;
      font-size: 0.85em; }
"""


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        return f"{value:,.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    return "–" if value is None else f"{float(value):.1%}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if isinstance(cell, str) else _fmt(cell)
            cls = ' class="n"' if i and not isinstance(cell, str) else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _pairs(rows: list[tuple[str, Any]]) -> str:
    """A two-column table (field, value); values already formatted as text stay as they are."""
    return _table(["", "value"], [[label, value] for label, value in rows])


def _confidence_text(c: dict[str, Any] | None) -> str:
    """The step times' rung and why (absent from summaries written before it existed)."""
    return f"{c['level']}: {c['detail']}" if c else "not recorded"


def _run_facts(s: dict[str, Any]) -> str:
    sc = s.get("scenario") or {}
    if not sc:
        return ""
    e = sc.get("engine", {})
    policies = sc.get("policies", {})
    return _pairs(
        [
            ("model", str(sc.get("model"))),
            ("GPU × tensor parallel", f"{sc.get('gpu')} × tp {sc.get('tp')}"),
            ("instances", sc.get("instances")),
            ("latency model", str(sc.get("latency", {}).get("model"))),
            ("confidence", _confidence_text(s.get("confidence"))),
            ("seed", sc.get("seed")),
            (
                "max_num_seqs / token budget",
                f"{e.get('max_num_seqs')} / {e.get('max_num_batched_tokens')}",
            ),
            ("KV blocks × block size", f"{_fmt(e.get('kv_blocks'))} × {e.get('block_size')}"),
            (
                "routing / scheduler / preemption",
                f"{policies.get('routing')} / {policies.get('scheduler')} / {policies.get('preemption')}",
            ),
            ("simulated duration (s)", float(s.get("sim_duration_s", 0.0))),
        ]
    )


def _requests_table(s: dict[str, Any]) -> str:
    keys = [
        ("injected (arrived)", "injected_requests"),
        ("completed", "completed_requests"),
        ("still queued at the end", "still_queued"),
        ("still running at the end", "still_running"),
        ("in transit at the end", "in_transit"),
        ("dropped (unservable)", "dropped_unservable"),
        ("rejected", "rejected_requests"),
        ("shed", "shed_requests"),
        ("expired", "expired_requests"),
        ("in the gateway queue at the end", "gateway_queued"),
        ("length-capped", "length_capped_requests"),
    ]
    return _pairs([(label, s.get(key)) for label, key in keys if key in s])


def _throughput_table(s: dict[str, Any]) -> str:
    rows: list[tuple[str, Any]] = [
        ("completed requests / s", s.get("responses_per_sec")),
        ("output tokens / s", s.get("tokens_per_sec")),
        ("input tokens / s (completed)", s.get("input_tokens_per_sec")),
        ("output tokens (completed)", s.get("total_output_tokens")),
        ("input tokens (enqueued)", s.get("total_input_tokens")),
    ]
    if "goodput_rps" in s:
        rows.append(("goodput (requests / s meeting their SLO)", s["goodput_rps"]))
        rows.append(("SLO attainment", _pct(s.get("slo_attainment"))))
    return _pairs(rows)


def _latency_table(s: dict[str, Any]) -> str:
    rows = []
    for key, label in (
        ("ttft", "TTFT"),
        ("itl", "ITL (every gap)"),
        ("tpot", "TPOT (per-request mean)"),
        ("e2e", "E2E"),
        ("scheduling_delay", "scheduling delay"),
    ):
        if f"{key}_mean_ms" in s:
            rows.append(
                [label]
                + [s.get(f"{key}_{stat}_ms") for stat in ("mean", "p50", "p90", "p95", "p99")]
            )
    return _table(["latency (ms)", "mean", "p50", "p90", "p95", "p99"], rows)


def _class_table(s: dict[str, Any]) -> str:
    per_class = s.get("per_class") or {}
    if not per_class:
        return ""
    goodput = s.get("goodput") or {}
    rows = []
    for cls, m in per_class.items():
        g = goodput.get(cls, {})
        rows.append(
            [
                cls,
                m.get("count"),
                m.get("ttft_mean_ms"),
                m.get("ttft_p50_ms"),
                m.get("ttft_p99_ms"),
                m.get("itl_mean_ms"),
                m.get("tpot_p99_ms"),
                m.get("e2e_mean_ms"),
                m.get("e2e_p50_ms"),
                m.get("e2e_p99_ms"),
                _pct(g.get("slo_attainment")) if g else "–",
                g.get("goodput_rps") if g else "–",
            ]
        )
    return _table(
        [
            "SLO class",
            "completed",
            "TTFT mean (ms)",
            "TTFT p50 (ms)",
            "TTFT p99 (ms)",
            "ITL mean, every gap (ms)",
            "TPOT p99, per request (ms)",
            "E2E mean (ms)",
            "E2E p50 (ms)",
            "E2E p99 (ms)",
            "SLO attainment",
            "goodput (req/s)",
        ],
        rows,
    ) + (
        "<p class='sub'>Per-class ITL is each request's mean inter-token latency (TPOT); "
        "attainment counts every request of the class that arrived.</p>"
    )


def _kv_table(s: dict[str, Any]) -> str:
    rows: list[tuple[str, Any]] = [
        ("KV utilisation, time-weighted mean", _pct(s.get("kv_utilization_mean"))),
        ("KV utilisation, peak", _pct(s.get("kv_utilization_peak"))),
        ("prefix-cache hit rate (blocks)", _pct(s.get("cache_hit_rate"))),
        ("prompt tokens found in the prefix cache", _pct(s.get("prefix_cached_token_fraction"))),
        ("preemptions", s.get("preemption_count")),
        ("requests preempted at least once", s.get("preempted_requests")),
        ("KV blocks evicted from the prefix cache", s.get("kv_evicted_blocks")),
    ]
    if s.get("kv_cpu_stored_blocks") or s.get("kv_cpu_reloaded_blocks"):
        rows += [
            ("blocks stored to CPU", s.get("kv_cpu_stored_blocks")),
            ("blocks reloaded from CPU", s.get("kv_cpu_reloaded_blocks")),
            ("blocks evicted from CPU", s.get("kv_cpu_evicted_blocks")),
            ("time reloading from CPU (ms)", s.get("kv_cpu_reload_ms")),
        ]
    if s.get("spec_accepted_tokens_per_step"):
        rows.append(
            ("speculative tokens accepted per verification", s["spec_accepted_tokens_per_step"])
        )
    rows += [
        ("engine steps", s.get("steps")),
        ("fast-forwarded windows", s.get("fast_forward_windows")),
        ("load imbalance (max / mean requests per instance)", s.get("load_imbalance")),
    ]
    return _pairs(rows)


def _instances_table(s: dict[str, Any], data: ResultsData) -> str:
    per = s.get("per_instance") or []
    if not per:
        return ""
    rows = [
        [
            data.instance_label(int(p["index"])),
            str(p.get("gpu")),
            p.get("requests"),
            p.get("completed"),
            p.get("steps"),
            _pct(p.get("busy_fraction")),
            p.get("preemptions"),
            p.get("kv_blocks"),
        ]
        for p in per
    ]
    return _table(
        ["instance", "GPU", "requests", "completed", "steps", "busy", "preemptions", "KV blocks"],
        rows,
    )


def _gateway_section(s: dict[str, Any], data: ResultsData) -> str:
    fc = data.flow_control
    if fc is None:
        return ""
    a = s.get("anomalies", {})
    return "<h2>Flow control (gateway)</h2>" + _pairs(
        [
            ("detector", str(fc.get("detector"))),
            ("order", str(fc.get("order"))),
            ("max_queue", fc.get("max_queue")),
            ("shedding", bool(fc.get("shedding"))),
            ("rejected (gateway full)", a.get("gateway_rejected")),
            ("shed", a.get("gateway_shed")),
            ("expired", a.get("gateway_expired")),
            ("peak queue depth", a.get("gateway_peak_depth")),
        ]
    )


def _pd_section(s: dict[str, Any]) -> str:
    pd = s.get("pd")
    if not pd:
        return ""
    out = ["<h2>Prefill/decode disaggregation</h2>", "<div class='grid'><div>"]
    out.append(
        _pairs(
            [
                ("decider", str(pd.get("decider"))),
                ("split requests", pd.get("split_requests")),
                ("served on one instance", pd.get("local_requests")),
                ("completed after a split", pd.get("disaggregated_completed")),
                ("dropped at the decode instance (KV full)", pd.get("dropped_at_decode_kv")),
                ("transfers completed", pd.get("transfers_completed")),
                ("KV moved (GB)", float(pd.get("kv_bytes_moved", 0.0)) / 1e9),
                ("peak concurrent transfers", pd.get("peak_concurrent_transfers")),
                ("prefill/decode throughput imbalance", pd.get("load_imbalance_ratio")),
            ]
        )
    )
    out.append("</div><div>")
    rows = []
    for key, label in (
        ("transfer", "transfer duration"),
        ("transfer_queueing", "time lost sharing the link"),
        ("split_ttft", "TTFT of split requests"),
    ):
        rows.append(
            [label] + [pd.get(f"{key}_{stat}_ms") for stat in ("mean", "p50", "p90", "p99")]
        )
    out.append(_table(["(ms)", "mean", "p50", "p90", "p99"], rows))
    pools = [
        [
            role,
            ", ".join(str(i) for i in p.get("instances", [])),
            p.get("completed"),
            p.get("throughput_rps"),
            _pct(p.get("busy_fraction")),
            p.get("output_tokens_per_sec"),
        ]
        for role, p in pd.get("pools", {}).items()
    ]
    out.append(
        _table(["pool", "instances", "completed", "requests / s", "busy", "output tok/s"], pools)
    )
    links = [
        [
            link.get("name"),
            link.get("transfers"),
            link.get("peak_concurrent"),
            float(link.get("bytes_moved", 0.0)) / 1e9,
            _pct(link.get("busy_fraction")),
        ]
        for link in pd.get("links", [])
    ]
    out.append(_table(["link", "transfers", "peak at once", "GB moved", "busy"], links))
    out.append("</div></div>")
    return "".join(out)


def _sessions_section(s: dict[str, Any]) -> str:
    se = s.get("sessions")
    if not se:
        return ""
    return "<h2>Sessions</h2>" + _pairs(
        [
            ("sessions", se.get("count")),
            (
                "completed / cancelled / interrupted / exhausted",
                f"{se.get('completed')} / {se.get('cancelled')} / {se.get('interrupted')} / "
                f"{se.get('exhausted')}",
            ),
            ("rounds", se.get("rounds")),
            (
                "TTFT of first rounds (cold), mean / p99 (ms)",
                f"{_fmt(se.get('ttft_cold_mean_ms'))} / {_fmt(se.get('ttft_cold_p99_ms'))}",
            ),
            (
                "TTFT of later rounds (warm), mean / p99 (ms)",
                f"{_fmt(se.get('ttft_warm_mean_ms'))} / {_fmt(se.get('ttft_warm_p99_ms'))}",
            ),
            (
                "session duration, mean / p50 (s)",
                f"{_fmt(se.get('duration_mean_s'), 2)} / {_fmt(se.get('duration_p50_s'), 2)}",
            ),
        ]
    )


def _audit_section(s: dict[str, Any]) -> str:
    audit = s.get("audit") or {}
    if not audit.get("checked"):
        verdict = "<span class='skip'>not checked</span> (the run skipped the audit)"
    elif audit.get("passed"):
        verdict = "<span class='pass'>passed</span>: every invariant held"
    else:
        verdict = (
            f"<span class='fail'>FAILED</span>: {len(audit.get('violations', []))} violation(s)"
        )
    out = f"<h2>Audit</h2><p>{verdict}</p>"
    violations = audit.get("violations") or []
    if violations:
        out += "<ul>" + "".join(f"<li>{html.escape(str(v))}</li>" for v in violations) + "</ul>"
    conservation = s.get("conservation") or {}
    if conservation:
        out += _table(
            list(conservation.keys()),
            [[_fmt(v) for v in conservation.values()]],
        )
    if s.get("interrupted"):
        out += "<p class='fail'>The run was interrupted (Ctrl-C): the results are partial.</p>"
    return out


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def report_html(data: ResultsData) -> str:
    """The report page of loaded results, as an HTML string."""
    s = data.summary
    figures, skipped = build_figures(data)
    name = html.escape(data.name)
    audit = s.get("audit") or {}
    verdict = (
        "audit skipped"
        if not audit.get("checked")
        else ("audit passed" if audit.get("passed") else "audit FAILED")
    )
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>servesim report: {name}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>servesim report: {name}</h1>",
        f"<p class='sub'>{_fmt(s.get('completed_requests'))} of "
        f"{_fmt(s.get('injected_requests'))} requests completed in "
        f"{float(s.get('sim_duration_s', 0.0)):.1f} s simulated; {verdict}. "
        f"Results directory: <code>{html.escape(str(data.root))}</code></p>",
        "<h2>Summary</h2><div class='grid'>",
        f"<div><h3>Run</h3>{_run_facts(s)}</div>",
        f"<div><h3>Requests</h3>{_requests_table(s)}</div>",
        f"<div><h3>Throughput</h3>{_throughput_table(s)}</div>",
        "</div>",
        f"<h3>Latency</h3>{_latency_table(s)}",
        "<p class='sub'>ITL is over every inter-token gap; TPOT is each request's mean gap. "
        "Percentiles interpolate linearly between closest ranks over completed requests.</p>",
    ]
    class_table = _class_table(s)
    if class_table:
        parts.append(f"<h3>Per SLO class</h3>{class_table}")
    parts.append("<div class='grid'>")
    parts.append(f"<div><h3>KV cache and preemption</h3>{_kv_table(s)}</div>")
    instances = _instances_table(s, data)
    if instances:
        parts.append(f"<div><h3>Instances</h3>{instances}</div>")
    parts.append("</div>")
    parts.append(_gateway_section(s, data))
    parts.append(_pd_section(s))
    parts.append(_sessions_section(s))
    parts.append(_audit_section(s))
    parts.append("<h2>Figures</h2>")
    for number, (fig_name, fig) in enumerate(figures.items(), start=1):
        caption = html.escape(figure_caption(fig))
        parts.append(
            f"<figure id='{fig_name}'><img alt='{fig_name}' src='data:image/png;base64,"
            f"{_png(fig)}'><figcaption><b>Figure {number} ({fig_name}).</b> {caption}"
            "</figcaption></figure>"
        )
    if skipped:
        parts.append("<p class='sub'>Not drawn for this run:</p><ul>")
        parts.extend(
            f"<li><code>{html.escape(n)}</code>: {html.escape(why)}</li>"
            for n, why in skipped.items()
        )
        parts.append("</ul>")
    parts.append("<h2>Scenario</h2>")
    parts.append(
        "<p class='sub'>As resolved by the run (<code>summary.json</code> → "
        "<code>scenario</code>):</p>"
    )
    parts.append(f"<pre>{html.escape(json.dumps(s.get('scenario', {}), indent=2))}</pre>")
    if data.scenario_yaml:
        parts.append(
            "<details><summary>scenario.yaml (the input, after overrides)</summary>"
            f"<pre>{html.escape(data.scenario_yaml)}</pre></details>"
        )
    parts.append("<p class='sub'>Written by <code>servesim report</code>.</p></body></html>")
    return "\n".join(p for p in parts if p)


def render_report(data: ResultsData, out_file: str | Path) -> Path:
    """Write the report of loaded results to ``out_file`` atomically; return its path."""
    out = Path(out_file)
    text = report_html(data)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, text)
    except OSError as exc:
        raise ScenarioError(
            "--out", str(out), f"cannot write the report there ({exc.strerror or exc})"
        ) from None
    return out


def write_report(results_dir: str | Path, out_file: str | Path | None = None) -> Path:
    """Write the HTML report of a results directory (default ``RESULTS_DIR/report.html``)."""
    data = ResultsData.load(results_dir)
    target = Path(results_dir) / "report.html" if out_file is None else Path(out_file)
    return render_report(data, target)


def _report_arguments(p: argparse.ArgumentParser) -> None:
    add_saved_run_arguments(
        p, out="FILE", out_help="HTML file to write (default: RESULTS_DIR/report.html)"
    )


def cmd_report(args: argparse.Namespace) -> int:
    """Write the report and print its path."""
    out = write_report(args.results_dir, args.out)
    print(f"{out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


add_report_parser = Command(
    "report",
    help="write a saved run's summary and figures as one HTML page (needs servesim[plot])",
    description=(
        "Write one self-contained HTML page for a results directory written by `servesim "
        "run`: the summary tables (requests, throughput, latency percentiles, per SLO "
        "class, KV cache and preemption, flow control and disaggregation when present), "
        "the audit verdict, the scenario and the figures of `servesim plot`, embedded as "
        "images. The page needs no other file. Needs matplotlib: pip install "
        "'servesim[plot]'."
    ),
    arguments=_report_arguments,
    handler=cmd_report,
)
"""Add the ``report`` command to the CLI's subparsers; dispatch it to :func:`cmd_report`."""
