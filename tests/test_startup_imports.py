"""Start-up stays fast because the run path imports only what a run needs (issue 16).

Each check starts a fresh interpreter (this process has imported everything already) and reads
its ``sys.modules``. This is not a timing test: it fails when an import that start-up must not
pay for (plots, fitting, sweeps, pandas, Ray, structlog's asyncio, the entry-point scan) creeps
back onto the path, whatever the machine's speed. ``bench/startup.py`` measures the time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NEVER_ON_THE_RUN_PATH = (
    "matplotlib",
    "pandas",
    "ray",
    "scipy",
    "asyncio",  # structlog imports it; loaded only when a line is actually logged
    "structlog",
    "servesim.analysis.plots",
    "servesim.analysis.report",
    "servesim.fidelity",
    "servesim.studies",
    "servesim.memory",
    "servesim.observe",
    "servesim.workloads.traces",  # a synthetic workload needs no trace reader
    "hypothesis",  # the plugin check kit's property tests (servesim.testing)
    "httpx",  # servesim observe's client
    "servesim.testing",
    "servesim.plugins",  # the plugin author's front door imports every base class and the kit
)
"""Not imported by ``servesim run`` of a tiny scenario that logs nothing."""

NOT_WITHOUT_RESULTS = (
    "servesim.analysis.writing",  # the results directory's writer and its tables
    "servesim.analysis.tables",
)
"""Not imported by a run that writes no results directory (``--no-write``, ``simulate()``)."""

NOT_WHILE_PARSING = NEVER_ON_THE_RUN_PATH + (
    "importlib.metadata",  # the entry-point scan; SimPy imports it too, for its version
    "simpy",
    "servesim.components",
    "servesim.audit",
)
"""Not imported by ``import servesim.cli`` plus loading a tiny scenario."""

NOT_FOR_THE_CLI_MODULE = ("numpy", "yaml", "attrs", "simpy", "servesim.scenario")
"""``import servesim.cli`` alone parses no scenario: none of these yet."""


def modules_after(code: str, tmp_path) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
        timeout=60,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def imported(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that ``modules`` holds, a package counting with any of its modules."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


@pytest.fixture(scope="module")
def parse_path(tmp_path_factory) -> set[str]:
    return modules_after(
        "import servesim.cli\n"
        "from servesim.scenario import load_scenario\n"
        "load_scenario(None, ['workload.requests=1'])",
        tmp_path_factory.mktemp("parse"),
    )


def test_importing_the_cli_imports_no_simulator_and_no_numpy(tmp_path):
    modules = modules_after("import servesim.cli", tmp_path)
    assert imported(modules, NOT_FOR_THE_CLI_MODULE) == []


def test_loading_a_scenario_imports_neither_the_engine_nor_the_extras(parse_path):
    assert imported(parse_path, NOT_WHILE_PARSING) == []


def test_loading_a_scenario_registers_the_built_ins_it_names(parse_path):
    """The check above would pass vacuously if nothing were loaded: the plugin packages are."""
    assert {"servesim.latency.blackbox", "servesim.policies", "numpy"} <= parse_path


def test_a_tiny_run_imports_nothing_it_does_not_use(tmp_path):
    modules = modules_after(
        "from servesim.cli import main\nassert main(['run', '--requests', '1', '--no-write']) == 0",
        tmp_path,
    )
    assert imported(modules, NEVER_ON_THE_RUN_PATH + NOT_WITHOUT_RESULTS) == []
    assert {"servesim.components.cluster", "servesim.audit", "simpy"} <= modules


def test_a_tiny_run_that_writes_its_results_loads_the_writer(tmp_path):
    """The check above would pass vacuously if nothing ever loaded the writer: writing does."""
    modules = modules_after(
        "from servesim.cli import main\n"
        "assert main(['run', '--requests', '1', '--no-progress', '--out', 'out']) == 0",
        tmp_path,
    )
    assert imported(modules, NEVER_ON_THE_RUN_PATH) == []
    assert set(NOT_WITHOUT_RESULTS) <= modules
    assert (tmp_path / "out" / "summary.json").is_file()


def test_a_short_run_with_its_progress_bar_on_imports_no_tqdm(tmp_path):
    """As in a terminal: the bar (and tqdm) would appear only after 2 s of wall time."""
    modules = modules_after(
        "import servesim\n"
        "scenario = servesim.load_scenario(None, ['workload.requests=1'])\n"
        "servesim.simulate(scenario, progress=True)",
        tmp_path,
    )
    assert "tqdm" not in modules
    assert "servesim.progress" in modules


def test_a_logged_warning_still_loads_structlog(tmp_path):
    """The lazy logger is lazy, not silent: a line at an enabled level loads structlog."""
    modules = modules_after(
        "from servesim.simcore.log import get_logger\n"
        "get_logger('servesim.test').info('filtered at the default level')\n"
        "import sys\n"
        "assert 'structlog' not in sys.modules\n"
        "get_logger('servesim.test').warning('shown')",
        tmp_path,
    )
    assert "structlog" in modules


def test_a_trace_format_is_found_by_name_in_a_fresh_interpreter(tmp_path):
    """The trace readers load on the first ``trace_format`` lookup, not with the workloads."""
    modules = modules_after(
        "from servesim.simcore import registry\n"
        "assert registry.get('trace_format', 'csv').__name__ == 'CsvFormat'",
        tmp_path,
    )
    assert "servesim.workloads.traces.generic_csv" in modules
