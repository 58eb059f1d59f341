"""The plugin author's front door: everything needed to write, register and test a plugin.

::

    from servesim.plugins import RoutingPolicy, register

    @register("routing", "shortest-queue")
    class ShortestQueue(RoutingPolicy):
        def route(self, request, snapshots):
            return min(snapshots, key=lambda s: (s.queue_depth, s.index)).index

Save it as ``my_policies.py`` and run ``servesim run scenario.yaml --plugin my_policies.py
--set policies.routing=shortest-queue``: no packaging needed. A package ships plugins through
the entry-point group ``servesim.plugins`` instead (see :mod:`servesim.simcore.registry`).

Exported here: :func:`register` (``replace=True`` swaps out a built-in of the same name), one
base class per plugin kind, the data a plugin sees (snapshots, cluster state, batch summaries),
:class:`PluginContext` (the ``ctx`` of the one signature every kind is built with,
``from_config(params, ctx)``; a latency model gets a :class:`LatencyContext`, which adds the
served model, GPU and TP), the config helpers a ``from_config`` uses to validate its parameters, :class:`ScenarioError`,
the check kit (``check_<kind>``, see :mod:`servesim.testing`) and :func:`load_plugin_file`.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from servesim import testing
from servesim.latency.base import BatchSummary, LatencyContext, LatencyModel
from servesim.policies.admission import AdmissionPolicy
from servesim.policies.autoscaling import Autoscaler, FleetSignals
from servesim.policies.disaggregation import Decider
from servesim.policies.preemption import PreemptionPolicy
from servesim.policies.routing import RoutingPolicy
from servesim.policies.saturation import SaturationDetector
from servesim.policies.scheduling import Scheduler
from servesim.policies.scorers import Scorer
from servesim.policies.snapshot import ClusterState, InstanceSnapshot
from servesim.simcore.config import (
    as_bool,
    as_float,
    as_int,
    as_str,
    check_keys,
    expect_mapping,
    parse_bytes,
    parse_duration_us,
)
from servesim.simcore.errors import ScenarioError, ServesimError
from servesim.simcore.registry import KINDS, PluginContext, get, register, registry
from servesim.testing import *  # noqa: F403 -- the check kit, whole (testing.__all__)
from servesim.workloads.arrivals import ArrivalProcess
from servesim.workloads.lengths import LengthDistribution
from servesim.workloads.traces import TraceFormat

BASE_CLASSES = {
    "admission": AdmissionPolicy,
    "routing": RoutingPolicy,
    "scorer": Scorer,
    "scheduler": Scheduler,
    "preemption": PreemptionPolicy,
    "disaggregation": Decider,
    "saturation": SaturationDetector,
    "autoscaler": Autoscaler,
    "latency": LatencyModel,
    "arrival": ArrivalProcess,
    "length": LengthDistribution,
    "trace_format": TraceFormat,
}
"""The base class to subclass for each plugin kind (the registry's kinds)."""


def load_plugin_file(file: str | Path) -> ModuleType:
    """Import a local Python file for its ``register`` calls (what ``--plugin FILE`` does).

    The module is named after the file (``my_policies.py`` → ``my_policies``) and the file's
    directory is searched for its own imports while it loads. Loading the same file twice is a
    no-op. A missing file or an exception while it runs is a one-line :class:`ServesimError`
    naming the file and the failing line.
    """
    path = Path(file)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "file not found"
        raise ServesimError(f"--plugin {file}: {why}; give a Python file that registers plugins")
    path = path.resolve()
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise ServesimError(
            f"--plugin {file}: a module named {name!r} is already imported from "
            f"{getattr(loaded, '__file__', None) or 'a built-in'}; rename the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ServesimError(f"--plugin {file}: not a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the author's bug: one line naming where, not a traceback
        del sys.modules[name]
        lines = [
            f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)
        ]
        where = f" at line {lines[-1]}" if lines else ""
        raise ServesimError(
            f"--plugin {file} failed to load{where}: {exc.__class__.__name__}: {exc}"
        ) from exc
    finally:
        sys.path.remove(str(path.parent))
    return module


__all__ = [
    *testing.__all__,  # the check kit
    "BASE_CLASSES",
    "KINDS",
    "AdmissionPolicy",
    "ArrivalProcess",
    "Autoscaler",
    "BatchSummary",
    "ClusterState",
    "Decider",
    "FleetSignals",
    "InstanceSnapshot",
    "LatencyContext",
    "LatencyModel",
    "LengthDistribution",
    "PluginContext",
    "PreemptionPolicy",
    "RoutingPolicy",
    "SaturationDetector",
    "ScenarioError",
    "Scheduler",
    "Scorer",
    "TraceFormat",
    "as_bool",
    "as_float",
    "as_int",
    "as_str",
    "check_keys",
    "expect_mapping",
    "get",
    "load_plugin_file",
    "parse_bytes",
    "parse_duration_us",
    "register",
    "registry",
]
