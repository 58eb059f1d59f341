"""The documentation cannot fall behind the code.

Every scenario field, plugin and plugin parameter is in the scenario reference; every CLI flag is
in the CLI reference; every summary field and output column is in the outputs reference; the
"not modelled yet" page covers `servesim --help`'s epilog; the console output pasted into the
docs is what the commands print today; the how-to code is the code the examples run; and every
link between the pages resolves.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import runpy
import shlex
from pathlib import Path

import numpy as np
import pytest

import servesim
from servesim import cli
from servesim.analysis.tables import REQUEST_CSV_COLUMNS
from servesim.components.record import STEP_COLUMNS
from servesim.scenario import (
    AUDIT_FIELDS,
    ENGINE_FIELDS,
    FLOW_CONTROL_FIELDS,
    GROUP_FIELDS,
    OUTPUT_FIELDS,
    POLICY_FIELDS,
    SLO_TARGET_FIELDS,
    TOP_LEVEL_FIELDS,
)
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError
from servesim.workloads.synthetic import SyntheticWorkload

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def read(rel: str) -> str:
    return (DOCS / rel).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next heading of the same level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


# ---------------------------------------------------------------------- scenario reference

SCENARIO = read("reference/scenario.md")


def allowed_fields(override: str) -> list[str]:
    """The keys a scenario section accepts, read from the error an unknown key produces."""
    with pytest.raises(ScenarioError) as err:
        servesim.load_scenario(None, [override])
    match = re.search(r"allowed fields: (.*)$", str(err.value))
    assert match, f"{override!r} did not produce an unknown-field error: {err.value}"
    return [f.strip() for f in match.group(1).split(",") if f.strip()]


def allowed_fields_with(base: str, override: str) -> list[str]:
    with pytest.raises(ScenarioError) as err:
        servesim.load_scenario(None, [base, override])
    match = re.search(r"allowed fields: (.*)$", str(err.value))
    assert match, f"{override!r} did not produce an unknown-field error: {err.value}"
    return [f.strip() for f in match.group(1).split(",") if f.strip()]


def documented_fields() -> list[str]:
    fields = [f"`{f}`" for f in TOP_LEVEL_FIELDS]
    fields += [f"`engine.{f}`" for f in ENGINE_FIELDS]
    fields += [f"`policies.{f}`" for f in POLICY_FIELDS]
    fields += [f"`output.{f}`" for f in OUTPUT_FIELDS]
    fields += [f"`audit.{f}`" for f in AUDIT_FIELDS]
    fields += [f"`policies.flow_control.{f}`" for f in FLOW_CONTROL_FIELDS]
    fields += [f"`slo.<class>.{f}`" for f in SLO_TARGET_FIELDS]
    fields += [f"`workload.{f}`" for f in SyntheticWorkload.fields]
    # Sections without an exported field list: ask the validator which keys it accepts.
    fields += [f"`cluster.{f}`" for f in allowed_fields("cluster.zz_probe=1")]
    pools = "cluster.pools={prefill: {instances: 1}, decode: {instances: 1}}"
    fields += [
        f"`{f}`"
        for f in allowed_fields("cluster.pools={prefill: {zz_probe: 1}, decode: {instances: 1}}")
    ]
    fields += [f"`{f}`" for f in allowed_fields_with(pools, "cluster.kv_transfer.zz_probe=1")]
    fields += [
        f"`engine.speculative.{f}`"
        for f in allowed_fields(
            "engine.speculative={draft_tokens: 1, acceptance_rate: 0.5, zz_probe: 1}"
        )
    ]
    fields += [
        f"`{f}`" for f in allowed_fields("workload.prefix={tokens: 1, zz_probe: 1}")
    ]  # prefix keys
    return fields


@pytest.mark.parametrize("field", documented_fields())
def test_scenario_reference_documents_every_field(field):
    assert field in SCENARIO, f"docs/reference/scenario.md does not document {field}"


def subsection(text: str, heading: str) -> str:
    """The text under a `### heading`, up to the next heading of level 2 or 3."""
    start = text.index(f"\n### {heading}\n")
    ends = [i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1)) if i >= 0]
    return text[start : min(ends) if ends else len(text)]


@pytest.mark.parametrize("name", registry.registry("latency").names())
def test_every_latency_model_has_a_section_with_its_parameters(name):
    assert f"\n### `{name}`\n" in SCENARIO, f"scenario.md has no section for latency model {name!r}"
    params = allowed_fields(f"latency={{model: {name}, zz_probe: 1}}")
    text = subsection(SCENARIO, f"`{name}`")
    missing = [p for p in params if f"`latency.{p}`" not in text]
    assert not missing, f"latency model {name!r}: parameters {missing} undocumented"


@pytest.mark.parametrize(
    "kind",
    [
        "admission",
        "routing",
        "scorer",
        "saturation",
        "scheduler",
        "preemption",
        "disaggregation",
        "latency",
        "trace_format",
    ],
)
def test_scenario_reference_names_every_builtin_plugin(kind):
    for name in registry.registry(kind).names():
        assert f"`{name}`" in SCENARIO, f"{kind} plugin {name!r} is not in scenario.md"


# How to make each control-plane plugin report its parameters (an unknown-field error).
PARAM_PROBES = {
    "admission": "policies.admission={{name: {name}, zz_probe: 1}}",
    "routing": "policies.routing={{name: {name}, zz_probe: 1}}",
    "scorer": "policies.routing={{name: weighted, scorers: {{{name}: {{zz_probe: 1}}}}}}",
    "saturation": "policies.flow_control={{detector: {{name: {name}, zz_probe: 1}}}}",
    "disaggregation": "policies.disaggregation={{name: {name}, zz_probe: 1}}",
}


@pytest.mark.parametrize("kind", sorted(PARAM_PROBES))
def test_every_control_plane_plugin_has_a_row_with_its_parameters(kind):
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", SCENARIO, flags=re.MULTILINE)
    }
    for name in registry.registry(kind).names():
        assert name in rows, f"{kind} {name!r} has no table row in scenario.md"
        for param in allowed_fields(PARAM_PROBES[kind].format(name=name)):
            assert f"`{param}`" in rows[name], f"{kind} {name!r}: parameter {param!r} undocumented"


def test_every_instance_group_field_is_documented():
    text = section(SCENARIO, "cluster")
    missing = [f for f in GROUP_FIELDS if f"| `{f}` |" not in text]
    assert not missing, f"cluster.groups fields missing from scenario.md: {missing}"


@pytest.mark.parametrize("kind", ["arrival", "length"])
def test_every_arrival_process_and_length_distribution_has_a_row_with_its_parameters(kind):
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", SCENARIO, flags=re.MULTILINE)
    }
    for name in registry.registry(kind).names():
        assert name in rows, f"{kind} {name!r} has no table row in scenario.md"
        for param in registry.get(kind, name).fields:
            assert f"`{param}`" in rows[name], f"{kind} {name!r}: parameter {param!r} undocumented"


def workload_kind_fields() -> list[tuple[str, str]]:
    """(scenario.md subsection, field) for every field of the three workload kinds."""
    from servesim.workloads.spec import WorkloadSpec
    from servesim.workloads.synthetic import Sessions
    from servesim.workloads.traces import TraceWorkload

    out = [("Synthetic stream", f"workload.{f}") for f in SyntheticWorkload.fields]
    out += [("Sessions", f"workload.sessions.{f}") for f in Sessions.FIELDS]
    out += [("Trace replay", f"workload.{f}") for f in TraceWorkload.fields]
    spec = "Workload spec: clients and stages"
    out += [(spec, f"workload.{f}") for f in WorkloadSpec.fields]
    out += [(spec, f"workload.clients[].{f}") for f in WorkloadSpec.client_fields]
    return out


@pytest.mark.parametrize("heading, field", workload_kind_fields(), ids=lambda x: str(x))
def test_every_workload_kind_has_a_row_for_each_of_its_fields(heading, field):
    text = subsection(SCENARIO, heading)
    assert f"| `{field}` |" in text, f"scenario.md, {heading}: no row for {field}"


# How to make each kind of stage report its parameters (an unknown-field error).
STAGE_PROBES = {
    "`{duration, rate}`": "{zz_probe: 1}",
    "`ramp`": "{ramp: {zz_probe: 1}}",
    "`spike`": "{spike: {zz_probe: 1}}",
    "`diurnal`": "{diurnal: {zz_probe: 1}}",
}


@pytest.mark.parametrize("stage", sorted(STAGE_PROBES))
def test_every_stage_kind_has_a_row_with_its_parameters(stage):
    text = subsection(SCENARIO, "Workload spec: clients and stages")
    row = next((line for line in text.splitlines() if line.startswith(f"| {stage} |")), None)
    assert row is not None, f"scenario.md has no row for the stage {stage}"
    params = allowed_fields(f"workload={{rate: 1, requests: 1, stages: [{STAGE_PROBES[stage]}]}}")
    missing = [p for p in params if f"`{p}`" not in row]
    assert not missing, f"stage {stage}: parameters {missing} undocumented"


def test_every_bundled_trace_is_named_and_every_replay_option_listed():
    from servesim.workloads.traces import TraceWorkload, bundled_traces

    replay = read("howto/replay-a-trace.md")
    for name in bundled_traces():
        assert f"`{name}`" in SCENARIO, f"scenario.md does not name the bundled trace {name}"
        assert f"| `{name}` |" in replay, f"replay-a-trace.md has no table row for {name}"
    missing = [f for f in TraceWorkload.fields if f"| `{f}` |" not in replay]
    assert not missing, f"replay-a-trace.md: replay options {missing} missing"


def test_every_duration_field_says_its_unit():
    units = section(SCENARIO, "Units")
    for field in ("horizon", "workload.duration", "workload.start", "output.timeseries_interval"):
        assert f"`{field}`" in units


# ---------------------------------------------------------------------- CLI reference

CLI = read("reference/cli.md")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **action.choices}


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_cli_reference_documents_every_command_and_flag(command):
    parser = subparsers()[command]
    if command:
        assert f"## servesim {command}\n" in CLI, f"no section for `servesim {command}`"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        for flag in action.option_strings:
            assert re.search(r"`" + re.escape(flag) + r"[` ]", CLI), f"{flag} of {command!r}"
        for choice in action.choices or ():
            if not isinstance(action, argparse._SubParsersAction):
                assert f"`{choice}`" in CLI, f"choice {choice!r} of {command!r}"


def test_cli_reference_maps_every_shortcut_to_its_field():
    for flag, (path, _, _) in cli.SHORTCUTS.items():
        row = next((line for line in CLI.splitlines() if line.startswith(f"| `{flag} ")), None)
        assert row is not None, f"no table row for {flag}"
        assert f"`{path}`" in row, f"{flag} should say it sets {path}"


# ---------------------------------------------------------------------- outputs reference

OUTPUTS = read("reference/outputs.md")


@pytest.fixture(scope="module")
def small_summary():
    return servesim.simulate(servesim.load_scenario(None, ["workload.requests=50"])).summary


def test_outputs_reference_documents_every_summary_field(small_summary):
    missing = [k for k in small_summary if f"`{k}`" not in OUTPUTS]
    missing += [f"scenario.{k}" for k in small_summary["scenario"] if f"`{k}`" not in OUTPUTS]
    assert not missing, f"summary.json fields missing from outputs.md: {missing}"


def test_outputs_reference_documents_the_disaggregation_outputs():
    from servesim.analysis.tables import PD_CSV_COLUMNS, TRANSFER_CSV_COLUMNS

    results = servesim.simulate(
        servesim.load_scenario(
            ROOT / "examples" / "pd-disaggregation.yaml", ["workload.requests=20"]
        )
    )
    pd = results.summary["pd"]
    section_text = section(OUTPUTS, "summary.json")
    missing = [
        k
        for k in pd
        if f"`{k}`" not in section_text and f"`{k.rsplit('_', 2)[0]}_mean_ms`" not in section_text
    ]
    missing += [k for k in pd["pools"]["decode"] if f"`{k}`" not in section_text]
    missing += [k for k in pd["links"][0] if f"`{k}`" not in section_text]
    missing += [c for c in PD_CSV_COLUMNS if f"| `{c}` |" not in OUTPUTS]
    missing += [
        c for c in TRANSFER_CSV_COLUMNS if f"`{c}`" not in section(OUTPUTS, "transfers.csv")
    ]
    assert not missing, f"disaggregation outputs missing from outputs.md: {missing}"


def test_outputs_reference_documents_every_column():
    missing = [c for c in REQUEST_CSV_COLUMNS if f"| `{c}` |" not in OUTPUTS]
    missing += [c for c in STEP_COLUMNS if f"| `i0_{c}` |" not in OUTPUTS]
    missing += [
        c
        for c in ("time_s", "instance", "waiting", "batch_size", "kv_utilization")
        if f"| `{c}` |" not in OUTPUTS
    ]
    assert not missing, f"columns missing from outputs.md: {missing}"


# ---------------------------------------------------------------------- what is modelled


def epilog_items() -> list[str]:
    text = normalise(cli.NOT_MODELLED.split("):", 1)[1]).rstrip(".")
    items = []
    for part in text.split(";"):
        for piece in re.split(r", | and ", part.strip()):
            if piece.strip():
                items.append(piece.strip())
    return items


def test_not_modelled_page_covers_the_help_epilog():
    page = normalise(section(read("explanation/what-is-modelled.md"), "Not modelled yet"))
    missing = [i for i in epilog_items() if i not in page]
    assert not missing, f"in `servesim --help`'s epilog but not in what-is-modelled.md: {missing}"


def test_help_points_to_the_not_modelled_page():
    assert "docs/explanation/what-is-modelled.md" in cli.NOT_MODELLED
    assert (DOCS / "explanation" / "what-is-modelled.md").exists()


# ---------------------------------------------------------------------- pasted output

WALL = re.compile(r"[\d.]+ s wall \([\d,]+ requests/s\)")
CPU = re.compile(r"^cpu +[\d.]+ ms$")  # servesim project's CPU time


def console_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """```console blocks as [(command, expected output lines), ...]."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, flags=re.DOTALL):
        commands: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:].strip(), []))
            elif commands:
                commands[-1][1].append(line)
        blocks.append(commands)
    return blocks


def runnable(command: str) -> bool:
    return command.startswith("servesim ") or command.startswith("python examples/")


def clean(lines: list[str]) -> list[str]:
    """Drop what depends on the machine: wall time, the results path, and where the working
    directory and the servesim package are (`servesim convert` prints the files it read)."""
    here = os.getcwd() + os.sep
    package_root = str(Path(servesim.__file__).resolve().parent.parent) + os.sep
    return [
        CPU.sub("cpu <time>", WALL.sub("<wall>", line.rstrip()))
        .replace(here, "")
        .replace(package_root, ".../")
        for line in lines
        if not line.startswith("results: ")
    ]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch working directory that sees the repository's examples."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    registry.describe()
    saved = {kind: dict(reg._items) for kind, reg in registry.REGISTRIES.items()}
    yield tmp_path
    for kind, reg in registry.REGISTRIES.items():
        reg._items.clear()
        reg._items.update(saved[kind])


def run_command(command: str, capsys) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "python":
        runpy.run_path(argv[1], run_name="__main__")
    else:
        args = argv[1:]
        if args[0] == "audit" and not os.path.isdir(args[1]):
            assert cli.main(["run", "--out", args[1]]) == 0  # the run the example audits
            capsys.readouterr()
        assert cli.main(args) == 0, f"`{command}` failed"
    return capsys.readouterr().out.splitlines()


PAGES_WITH_OUTPUT = [
    "getting-started.md",
    "reference/cli.md",
    "howto/write-a-policy.md",
    "howto/add-a-latency-model.md",
    "howto/route-requests.md",
    "howto/flow-control.md",
    "howto/autoscale.md",
    "howto/replay-a-trace.md",
    "howto/workloads.md",
    "howto/use-any-model.md",
    "howto/project.md",
    "howto/multimodal.md",
    "howto/offload-kv.md",
    "howto/lora-and-models.md",
]


@pytest.mark.parametrize("page", PAGES_WITH_OUTPUT)
def test_pasted_console_output_is_what_the_commands_print(page, workdir, capsys):
    checked = 0
    for block in console_blocks(read(page)):
        if not all(runnable(command) for command, _ in block):
            continue  # needs an installed plugin package or a shell
        for command, expected in block:
            actual = run_command(command, capsys)
            assert clean(actual) == clean(expected), f"{page}: output of `{command}` changed"
            checked += 1
    assert checked, f"{page} has no checked console block"


def test_recipe_search_output_is_what_plan_prints(workdir, capsys):
    """The worked recipe search of plan-capacity.md (its other plans take 10 s each and are not
    run here)."""
    blocks = [
        block
        for block in console_blocks(read("howto/plan-capacity.md"))
        if any("plan-recipes.yaml" in command for command, _ in block)
    ]
    assert blocks, "plan-capacity.md has no recipe-search console block"
    for block in blocks:
        for command, expected in block:
            actual = run_command(command, capsys)
            assert clean(actual) == clean(expected), f"output of `{command}` changed"


def knob_rows() -> list[list[str]]:
    text = read("getting-started.md")
    table = text[text.index("<!-- knob-table") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


@pytest.mark.parametrize("row", knob_rows(), ids=lambda r: r[0])
def test_knob_table_shows_what_each_command_gives(row, capsys):
    command = row[0].strip("`")
    assert cli.main([*shlex.split(command)[1:], "--json", "--no-write"]) == 0
    s = json.loads(capsys.readouterr().out)
    expected = [
        f"{s['responses_per_sec']:.2f}",
        f"{s['ttft_p50_ms']:.1f}",
        f"{s['ttft_p99_ms']:.1f}",
        f"{s['itl_p50_ms']:.1f}",
        f"{s['e2e_p50_ms']:.1f}",
        f"{s['kv_utilization_peak']:.1%}",
        str(s["preemption_count"]),
    ]
    assert row[1:] == expected, f"getting-started.md knob table row for `{command}`"


def test_routing_tables_are_what_compare_routers_prints(workdir, capsys, monkeypatch):
    monkeypatch.delenv("SERVESIM_EXAMPLE_REQUESTS", raising=False)  # the full-size run
    runpy.run_path(str(ROOT / "examples" / "compare_routers.py"), run_name="__main__")
    tables = capsys.readouterr().out.strip().split("\n\n")
    page = read("howto/route-requests.md")
    assert len(tables) == 2
    for table in tables:
        assert table in page, (
            f"route-requests.md: a table differs from compare_routers.py:\n{table}"
        )


def test_break_even_table_is_what_pd_break_even_prints(workdir, capsys, monkeypatch):
    monkeypatch.delenv("SERVESIM_EXAMPLE_REQUESTS", raising=False)  # the full-size run
    monkeypatch.setattr("sys.argv", ["pd_break_even.py"])
    runpy.run_path(str(ROOT / "examples" / "pd_break_even.py"), run_name="__main__")
    table = capsys.readouterr().out.strip()
    page = read("tutorial/disaggregation.md")
    assert table in page, f"tutorial/disaggregation.md: the table differs:\n{table}"


@pytest.mark.parametrize(
    "lesson, script",
    [
        ("lesson-1-queueing.md", "course/lesson1_queueing.py"),
        ("lesson-2-kv-cliff.md", "course/lesson2_kv_cliff.py"),
        ("lesson-3-affinity.md", "course/lesson3_affinity.py"),
        ("lesson-4-overload.md", "course/lesson4_overload.py"),
    ],
)
def test_lesson_tables_are_what_their_scripts_print(lesson, script, workdir, capsys, monkeypatch):
    monkeypatch.delenv("SERVESIM_EXAMPLE_REQUESTS", raising=False)  # the full-size run
    monkeypatch.setattr("sys.argv", [script])
    runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    printed = capsys.readouterr().out
    page = read(f"tutorial/{lesson}")
    table = "\n".join(line for line in printed.splitlines() if line.startswith("|"))
    assert table and table in page, f"tutorial/{lesson}: the table differs:\n{table}"


def marked_rows(text: str, marker: str) -> list[list[str]]:
    """The body rows of the Markdown table after ``<!-- marker``, as lists of cells."""
    table = text[text.index(f"<!-- {marker}") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]  # skip the header
    assert rows, f"no rows under <!-- {marker}"
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


FLOW = ROOT / "examples" / "flow-control-overload.yaml"
FLOW_CLASSES = ("critical", "standard", "sheddable")


def flow_run(overrides: list[str]):
    return servesim.simulate(servesim.load_scenario(FLOW, overrides))


def test_flow_control_class_table_is_what_the_run_gives():
    results = flow_run([])
    s, r = results.summary, results.requests
    names = results.record.requests.labels("slo_class")
    expected = []
    for cls in FLOW_CLASSES:
        mine = r["slo_class"] == names.index(cls)
        g, c = s["goodput"][cls], s["per_class"][cls]
        counts = [str(int((mine & (r["status"] == code)).sum())) for code in (0, 5, 6, 7)]
        expected.append(
            [f"`{cls}`", str(int(mine.sum())), *counts]
            + [f"{c['ttft_p50_ms']:.1f}", f"{c['ttft_p99_ms']:.1f}", str(g["good"])]
            + [f"{g['slo_attainment']:.1%}"]
        )
    assert marked_rows(read("howto/flow-control.md"), "flow-class-table") == expected


def test_flow_control_variant_table_is_what_the_runs_give():
    for row in marked_rows(read("howto/flow-control.md"), "flow-variant-table"):
        s = flow_run(re.findall(r"`([^`]+)`", row[0])).summary
        p99 = [f"{s['per_class'][c]['ttft_p99_ms']:.1f}" for c in FLOW_CLASSES]
        expected = [
            row[0],
            str(s["completed_requests"]),
            str(s["rejected_requests"]),
            str(s["shed_requests"]),
            str(s["expired_requests"]),
            *p99,
            f"{s['goodput']['critical']['slo_attainment']:.1%}",
            f"{s['slo_attainment']:.1%}",
            f"{s['goodput_rps']:.2f}",
        ]
        assert row == expected, f"flow-control.md variant table row {row[0]!r}"


def overrides_of(cell: str) -> list[str]:
    """The `--set` overrides a table row names in backticks (none for `as written`)."""
    return re.findall(r"`([^`]+)`", cell)


def test_flow_control_release_table_is_what_the_runs_give():
    for row in marked_rows(read("howto/flow-control.md"), "flow-release-table"):
        results = flow_run(overrides_of(row[0]))
        s, r = results.summary, results.requests
        released = r["instance"] >= 0
        # the example has no admission latency: a request leaves the gateway at arrival + wait
        left = (r["arrival_us"] + r["gateway_wait_us"])[released]
        expected = [
            row[0],
            str(int(np.bincount(left // 50_000).max())),
            f"{np.median(r['gateway_wait_us'][released]) / 1000:.1f}",
            str(s["completed_requests"]),
            f"{s['per_class']['critical']['ttft_p99_ms']:.1f}",
            f"{s['goodput']['critical']['slo_attainment']:.1%}",
            f"{s['slo_attainment']:.1%}",
            f"{s['goodput_rps']:.2f}",
        ]
        assert row == expected, f"flow-control.md release table row {row[0]!r}"


MOONCAKE = ROOT / "examples" / "mooncake-replay.yaml"


def test_mooncake_table_is_what_the_runs_give():
    for row in marked_rows(read("howto/replay-a-trace.md"), "mooncake-table"):
        s = servesim.simulate(servesim.load_scenario(MOONCAKE, overrides_of(row[0]))).summary
        expected = [
            row[0],
            f"{s['cache_hit_rate']:.1%}",
            f"{s['prefix_cached_token_fraction']:.1%}",
            f"{s['ttft_p50_ms']:.0f}",
            f"{s['ttft_p99_ms']:.0f}",
        ]
        assert row == expected, f"replay-a-trace.md Mooncake table row {row[0]!r}"


def test_mooncake_reuse_ceiling_is_the_traces():
    from servesim.workloads.traces import TraceWorkload

    scenario = servesim.load_scenario(MOONCAKE)
    assert isinstance(scenario.workload, TraceWorkload)
    reuse = scenario.workload.describe()["segments"]["reuse"]
    page = read("howto/replay-a-trace.md")
    assert f"{reuse:.1%} of their 512-token blocks repeat" in page


SPIKE_WINDOWS = ((0, 60), (60, 80), (80, 120))  # seconds: before, during and after the spike


def test_spike_table_is_what_the_run_gives():
    results = servesim.simulate(servesim.load_scenario(ROOT / "examples" / "multi-client.yaml"))
    r = results.requests
    clients = results.record.requests.labels("client")
    arrival_s = r["arrival_us"] / 1e6
    ttft_ms = (r["first_token_us"] - r["arrival_us"]) / 1000
    rows = marked_rows(read("howto/workloads.md"), "spike-table")
    assert len(rows) == len(SPIKE_WINDOWS)
    for row, (lo, hi) in zip(rows, SPIKE_WINDOWS):
        window = (arrival_s >= lo) & (arrival_s < hi)
        expected = [row[0], str(int(window.sum())), f"{window.sum() / (hi - lo):.1f}"]
        for name in ("chat", "summarize"):
            mine = ttft_ms[window & (r["client"] == clients.index(name))]
            expected += [f"{np.percentile(mine, 50):.0f}", f"{np.percentile(mine, 99):.0f}"]
        assert row == expected, f"workloads.md spike table row {row[0]!r}"


def test_session_round_table_is_what_the_run_gives():
    results = servesim.simulate(servesim.load_scenario(ROOT / "examples" / "sessions.yaml"))
    r = results.requests
    ttft_ms = (r["first_token_us"] - r["arrival_us"]) / 1000
    rows = marked_rows(read("howto/workloads.md"), "session-round-table")
    assert [row[0] for row in rows] == [str(k) for k in range(int(r["round_index"].max()) + 1)]
    for row in rows:
        mine = r["round_index"] == int(row[0])
        expected = [
            row[0],
            str(int(mine.sum())),
            f"{r['prompt_tokens'][mine].mean():.0f}",
            f"{r['cached_tokens'][mine].sum() / r['prompt_tokens'][mine].sum():.1%}",
            f"{ttft_ms[mine].mean():.1f}",
        ]
        assert row == expected, f"workloads.md session round table row {row[0]!r}"


# ---------------------------------------------------------------------- how-to code


@pytest.mark.parametrize(
    "page, example",
    [
        ("howto/write-a-policy.md", "custom_policy.py"),
        ("howto/write-a-policy.md", "custom_router.py"),
        ("howto/add-a-latency-model.md", "custom_latency_model.py"),
    ],
)
def test_howto_shows_the_code_its_example_runs(page, example):
    code = (ROOT / "examples" / example).read_text(encoding="utf-8").strip()
    assert code in read(page), f"{page} and examples/{example} differ; paste the file into the page"


def test_policy_in_the_howto_is_under_30_lines():
    tree = ast.parse((ROOT / "examples" / "custom_policy.py").read_text(encoding="utf-8"))
    (policy,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    first = min(d.lineno for d in policy.decorator_list)
    assert policy.end_lineno - first + 1 < 30


# ---------------------------------------------------------------------- links


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        assert resolved.exists(), f"{page.relative_to(DOCS)}: broken link {target}"
        if anchor:
            assert anchor in anchors(resolved), f"{page.relative_to(DOCS)}: no anchor {target}"


def test_design_page_states_the_record_sizes():
    from servesim.components.record import RequestTable, StepLog

    design = read("explanation/design.md")
    assert f"({StepLog.width} integers)" in design
    assert f"({RequestTable.width} integers" in design
    assert (
        f"{StepLog.width * 8} bytes per step and {RequestTable.width * 8} bytes per request"
        in design
    )
