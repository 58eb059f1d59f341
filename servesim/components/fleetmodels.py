"""Several models and LoRA adapters in one fleet: which instances may serve a request, what a
run records of them.

Each instance serves one model (its group's ``model``, else the scenario's) and, with
``engine.lora``, the adapters of its catalogue (:mod:`servesim.components.adapters`). A request
names a model (``""``: the scenario's) and an adapter (``""``: none). :class:`FleetModels`

* names each request's model and adapter as the workload gave them (:meth:`tag`), and keeps one
  model and one adapter code per request id for the metrics and the auditor;
* when not every instance can serve every request, wraps the routing policy so that it only
  sees the instances that serve the request's model and can load its adapter
  (:class:`ModelRouting`); a fleet of one model whose instances all know the same adapters keeps
  its router as it is;
* hands the ``adapter-affinity`` scorer each instance's adapter state.

None of this exists in a run that names no model and no adapter (the cluster keeps None).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from servesim.components.adapters import attach_lora


class ModelRouting:
    """A routing policy that is only shown the candidates able to serve the request."""

    def __init__(self, inner: Any, allowed: dict[tuple[str, str], frozenset[int]]):
        self.inner = inner
        self.allowed = allowed
        # the hints the cluster read from the policy before wrapping it, kept for readers
        self.needs_snapshots = getattr(inner, "needs_snapshots", True)
        self.reads_prefix_cache = getattr(inner, "reads_prefix_cache", False)

    def candidates(self, request: Any, snapshots: Sequence[Any]) -> list[Any]:
        keep = self.allowed[(request.model, request.adapter)]
        return [s for s in snapshots if s.index in keep]

    def route(self, request: Any, snapshots: Sequence[Any]) -> int:
        return self.inner.route(request, self.candidates(request, snapshots))

    def observe(self, request: Any, chosen_index: int) -> None:
        self.inner.observe(request, chosen_index)

    def scores(self, request: Any, snapshots: Sequence[Any]) -> list[float]:
        """The inner policy's scores, 0 for an instance that cannot serve the request."""
        keep = self.allowed[(request.model, request.adapter)]
        inner = getattr(self.inner, "scores", None)
        scores = (
            list(inner(request, snapshots))
            if inner is not None
            else [-float(s.effective_load) for s in snapshots]
        )
        return [x if s.index in keep else float("-inf") for x, s in zip(scores, snapshots)]


class FleetModels:
    """The fleet's models and adapters (module docstring)."""

    def __init__(self, cluster: Any, served: list[str], canonical: dict[str, str]):
        self.served = served  # each instance's model name
        # what a request naming no model is: the one model served, else the scenario's
        self.default = served[0] if len(set(served)) == 1 else cluster.scenario.model.name
        self.canonical = canonical  # a name the workload uses -> the served model's name
        self.catalogs = [
            frozenset(i.engine._lora.config.adapters) if i.engine._lora is not None else frozenset()
            for i in cluster.instances
        ]
        self.models: list[str] = sorted(set(served))
        self.adapters: list[str] = [""]
        self._adapter_codes = {"": 0}
        self.model_code = array("h")  # per request id
        self.adapter_code = array("h")
        self._model_codes = {name: k for k, name in enumerate(self.models)}
        self.routing: ModelRouting | None = None

    def tag(self, req: Any, spec: Any) -> None:
        """``req`` names the model and adapter ``spec`` names (a plain spec names neither)."""
        model = getattr(spec, "model", "")
        adapter = getattr(spec, "adapter", "")
        req.model = self.canonical.get(model, model) if model else self.default
        req.adapter = adapter
        codes = self._adapter_codes
        code = codes.get(adapter)
        if code is None:
            code = codes[adapter] = len(self.adapters)
            self.adapters.append(adapter)
        while len(self.model_code) < req.id:  # ids made elsewhere name nothing
            self.model_code.append(self._model_codes.get(self.default, 0))
            self.adapter_code.append(0)
        self.model_code.append(self._model_codes[req.model])
        self.adapter_code.append(code)

    def exporting(self, export: Any, exported: list) -> Any:
        """``export`` (the cluster's, for ``output.workload_trace``), whose specs then name the
        request's model and adapter, so that the written trace replays them."""
        from servesim.workloads.lora import tagged

        def export_named(req: Any, segments: Any) -> None:
            export(req, segments)
            exported[-1] = tagged(exported[-1], req.model, req.adapter)

        return export_named

    def allowed(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], frozenset[int]]:
        """For each (model, adapter) a request may name: the instances that can serve it."""
        out = {}
        for model, adapter in pairs:
            out[(model, adapter)] = frozenset(
                k
                for k, served in enumerate(self.served)
                if served == model and (not adapter or adapter in self.catalogs[k])
            )
        return out

    def close(self, record: Any, instances: Sequence[Any]) -> None:
        """What the run record keeps: per-request codes, names, per-instance adapter books."""
        n = record.arrived
        while len(self.model_code) < n:
            self.model_code.append(self._model_codes.get(self.default, 0))
            self.adapter_code.append(0)
        record.lora = {
            "models": list(self.models),
            "adapters": list(self.adapters),
            "model_code": np.frombuffer(self.model_code, dtype=np.int16).astype(np.int64),
            "adapter_code": np.frombuffer(self.adapter_code, dtype=np.int16).astype(np.int64),
            "served": list(self.served),
            "catalogs": [sorted(c) for c in self.catalogs],
            "instances": [
                i.engine._lora.counters() if i.engine._lora is not None else {} for i in instances
            ],
            "loads": [
                list(i.engine._lora.log) if i.engine._lora is not None else [] for i in instances
            ],
        }


def lora_for(engine: Any, spec: Any) -> None:
    """Attach the adapter state of an instance whose engine config has ``lora``."""
    e = spec.engine
    if e.lora is not None:
        attach_lora(engine, e.lora, spec.gpu)


def fleet_models(cluster: Any) -> FleetModels | None:
    """The fleet's :class:`FleetModels`, or None when requests name no model and no adapter
    and every instance serves the scenario's model."""
    from servesim.latency.modelindex import resolve_model

    scenario = cluster.scenario
    workload = scenario.workload
    served = [(spec.model or scenario.model).name for spec in scenario.instance_specs]
    names = tuple(getattr(workload, "model_names", ()) or ())
    adapters = tuple(getattr(workload, "adapter_names", ()) or ())
    lora = any(i.engine._lora is not None for i in cluster.instances)
    if not names and not adapters and len(set(served)) == 1 and not lora:
        return None
    canonical = {name: resolve_model(name, "workload.models").name for name in names}
    fleet = FleetModels(cluster, served, canonical)
    models = sorted(set(canonical.values()) | {fleet.default})
    pairs = [(m, a) for m in models for a in ("", *adapters)]
    allowed = fleet.allowed(pairs)
    everyone = frozenset(range(len(served)))
    if any(keep != everyone for (m, a), keep in allowed.items() if keep or m in served):
        fleet.routing = ModelRouting(cluster.router, allowed)
        cluster.router = fleet.routing
    if cluster.exported is not None:  # output.workload_trace: the trace names them too
        cluster._export = fleet.exporting(cluster._export, cluster.exported)
    router = fleet.routing.inner if fleet.routing is not None else cluster.router
    states = [i.engine._lora for i in cluster.instances]
    for scorer, _ in getattr(router, "scorers", ()):
        bind = getattr(scorer, "bind_adapters", None)
        if bind is not None:
            bind(states)
    return fleet
