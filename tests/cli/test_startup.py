"""How the console script starts (issue 16): no cyclic garbage collection while a command starts,
the collector back on before the simulation runs, and only the parser of the command being run.

Not timing tests: they check the mechanism, whatever the machine's speed (``bench/startup.py``
measures the time).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from servesim import cli

PROBE = """
import gc, json, sys
from servesim import cli, scenario
from servesim.components.cluster import Cluster

seen = {}
load, run = scenario.load_scenario, Cluster.run

def watched_load(*args, **kwargs):
    seen["gc_while_loading"] = gc.isenabled()
    return load(*args, **kwargs)

def watched_run(self):
    seen["gc_while_simulating"] = gc.isenabled()
    seen["frozen_when_simulating"] = gc.get_freeze_count()
    return run(self)

scenario.load_scenario, Cluster.run = watched_load, watched_run
sys.argv = ["servesim", *sys.argv[1:]]
try:
    cli.run_main()
except SystemExit as exc:
    seen["exit"] = exc.code
seen["gc_at_exit"] = gc.isenabled()
print(json.dumps(seen))
"""


def probe(tmp_path, *args: str) -> dict:
    """Run the console script's entry in a fresh interpreter with the probe's watchers."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_console_script_collects_no_garbage_until_the_cluster_is_built(tmp_path):
    seen = probe(tmp_path, "run", "--requests", "2", "--no-write", "--no-progress")
    assert seen["exit"] == 0
    assert seen["gc_while_loading"] is False
    assert seen["gc_while_simulating"] is True
    assert seen["frozen_when_simulating"] > 1000  # the modules and the scenario, frozen
    assert seen["gc_at_exit"] is True


def test_other_commands_turn_the_collector_back_on_once_parsed(tmp_path):
    seen = probe(tmp_path, "check", "--requests", "2")
    assert seen == {"gc_while_loading": True, "exit": 0, "gc_at_exit": True}


def test_main_called_from_python_leaves_the_callers_collector_alone(capsys):
    frozen = gc.get_freeze_count()
    assert cli.main(["run", "--requests", "2", "--no-write", "--no-progress"]) == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    gc.disable()
    try:
        assert cli.main(["check", "--requests", "2"]) == 0
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()
    capsys.readouterr()


@pytest.mark.parametrize("command", sorted(cli._CORE_PARSERS))
def test_a_core_command_builds_only_its_own_parser(command):
    parser = cli.build_parser(command)
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices) == [command]


@pytest.mark.parametrize("command", [None, "no-such-command"])
def test_help_and_an_unknown_command_build_every_parser(command):
    parser = cli.build_parser(command)
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices) == [*cli._CORE_PARSERS, *cli._COMMAND_MODULES]
