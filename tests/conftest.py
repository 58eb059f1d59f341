"""Shared test helpers: small scenario builders and a harness that drives one Engine without SimPy.

Scenario builders return plain dicts (what ``load_scenario`` accepts) with an explicit KV size, an
explicit ``max_model_len`` and explicit blackbox coefficients, so every run is small, fast and
independent of the bundled model/GPU tables.

The engine harness steps an :class:`~servesim.components.engine.Engine` by hand (form a batch at
``now``, end it at ``now + dt``) and reports, per step, which requests computed how many tokens,
which were admitted and which were preempted, so batch-formation rules can be checked one at a time.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

import servesim.components.instance as instance_module
from servesim.analysis.metrics import request_arrays
from servesim.components.engine import Engine, EngineLimits
from servesim.components.request import FINISHED, RUNNING, WAITING, Request
from servesim.latency.base import LatencyModel
from servesim.latency.blackbox import BlackboxLatencyModel
from servesim.run import Results, simulate
from servesim.scenario import load_scenario

# The suite never reads the user's HuggingFace cache: a model id resolves the same on every machine
# (tests of the HF-cache lookup point HF_HUB_CACHE at a cache they build in tmp_path).
os.environ["HF_HUB_CACHE"] = os.path.join(tempfile.gettempdir(), "servesim-tests-no-hf-cache")
os.environ.pop("HUGGINGFACE_HUB_CACHE", None)

# ---------------------------------------------------------------------- scenario builders


def scenario_dict(
    *,
    requests: int = 20,
    rate: float = 100.0,
    input: Any = 32,
    output: Any = 8,
    arrival: Any = "poisson",
    prefix: Mapping[str, int] | None = None,
    max_output_tokens: Any = None,
    kv_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int | None = None,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    long_prefill_token_threshold: int = 0,
    enable_chunked_prefill: bool = True,
    enable_prefix_caching: bool = True,
    alpha: Iterable[float] = (0, 0, 0),
    beta: Iterable[float] = (1000, 1, 10),
    horizon: Any = None,
    exact_steps: bool = False,
    kv_every_step: bool = False,
    audit: bool = True,
    seed: int = 1,
    instances: int = 1,
    **engine_extra: Any,
) -> dict[str, Any]:
    """A scenario dict (one instance unless told) with explicit KV blocks and blackbox coefficients.

    ``max_model_len`` defaults to the whole KV capacity (``kv_blocks * block_size``); further
    keyword arguments are engine fields (``kv_cpu_blocks``, ``speculative``, ...).
    """
    workload: dict[str, Any] = {
        "rate": rate,
        "requests": requests,
        "input": input,
        "output": output,
        "arrival": arrival,
    }
    if prefix is not None:
        workload["prefix"] = dict(prefix)
    if max_output_tokens is not None:
        workload["max_output_tokens"] = max_output_tokens
    data: dict[str, Any] = {
        "seed": seed,
        "latency": {"model": "blackbox", "alpha": list(alpha), "beta": list(beta)},
        "engine": {
            "kv_blocks": kv_blocks,
            "block_size": block_size,
            "max_model_len": max_model_len if max_model_len is not None else kv_blocks * block_size,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "long_prefill_token_threshold": long_prefill_token_threshold,
            "enable_chunked_prefill": enable_chunked_prefill,
            "enable_prefix_caching": enable_prefix_caching,
            **engine_extra,
        },
        "workload": workload,
        "exact_steps": exact_steps,
        "audit": {"enabled": audit, "kv_every_step": kv_every_step},
    }
    if horizon is not None:
        data["horizon"] = horizon
    if instances > 1:
        data["cluster"] = {"instances": instances}  # round-robin routing
    return data


def with_changes(data: Mapping[str, Any], **top_level: Any) -> dict[str, Any]:
    """A deep copy of a scenario dict with some top-level fields replaced."""
    out = copy.deepcopy(dict(data))
    out.update(top_level)
    return out


def run_scenario(data: Mapping[str, Any], *, raise_on_violation: bool = False) -> Results:
    """Load and simulate a scenario dict (audit per the scenario; violations returned, not raised)."""
    return simulate(load_scenario(data), raise_on_violation=raise_on_violation)


def step_logs(results: Results) -> list[dict[str, Any]]:
    """Every instance's step log as columns."""
    return [log.as_arrays() for log in results.record.step_logs]


def requests_of(results: Results) -> dict[str, Any]:
    """The per-request table as columns (ids ascending)."""
    return request_arrays(results.record)


@pytest.fixture
def small_windows(monkeypatch):
    """Fast-forward every steady-decode window of two steps or more (the Instance reads this
    module constant at construction), so differential tests exercise windows heavily."""
    monkeypatch.setattr(instance_module, "MIN_WINDOW_STEPS", 2)


# ---------------------------------------------------------------------- engine harness


def computed_tokens(engine: Engine, r: Request) -> int:
    """Tokens of ``r`` with KV in the cache at the start of the engine's next step.

    A steady decoder's progress is implicit (a function of the step index); everything else
    keeps it in ``num_computed``.
    """
    if r.state == RUNNING and r.finish_step >= 0:
        return r.anchor_computed + (engine.step - r.anchor_step)
    return r.num_computed


def generated_tokens(engine: Engine, r: Request) -> int:
    """Output tokens ``r`` has produced so far (the prefill-produced first token included)."""
    if r.state == RUNNING and r.finish_step >= 0:
        return computed_tokens(engine, r) - r.prompt_tokens + 1
    return r.num_generated


class StepReport:
    """What one engine step did, observed from outside the engine."""

    def __init__(self, start: int, dt: int, tokens, admitted, hits, preempted, finished, row):
        self.start = start
        self.dt = dt
        self.end = start + dt
        self.tokens: dict[int, int] = tokens  # request id -> tokens computed this step (> 0 only)
        self.admitted: list[int] = admitted  # ids moved from the wait queue to the batch, in order
        self.hits: dict[int, int] = hits  # admitted id -> tokens found in the prefix cache
        self.preempted: list[int] = preempted  # ids preempted this step
        self.finished: list[int] = finished  # ids that finished at the end of this step
        self.row: dict[str, int] = row  # this step's step-log row

    def __repr__(self) -> str:
        return (
            f"StepReport(start={self.start}, dt={self.dt}, tokens={self.tokens}, admitted={self.admitted}, "
            f"preempted={self.preempted}, finished={self.finished})"
        )


class EngineHarness:
    """Drive one Engine by hand: submit requests, run steps, observe each step's effect."""

    def __init__(
        self,
        *,
        alpha: Iterable[float] = (0, 0, 0),
        beta: Iterable[float] = (1000, 1, 10),
        latency: LatencyModel | None = None,
        **limits: Any,
    ):
        self.finished: list[Request] = []
        if latency is None:
            latency = BlackboxLatencyModel(tuple(alpha), tuple(beta))
        self.engine = Engine(EngineLimits(**limits), latency, on_finish=self.finished.append)
        self.now = 0
        self.requests: dict[int, Request] = {}
        self._next_id = 0

    @property
    def kv(self):
        return self.engine.kv

    @property
    def block_size(self) -> int:
        return self.engine.limits.block_size

    def submit(
        self,
        prompt: int,
        output: int,
        *,
        max_output_tokens: int = 0,
        prefix_group: int = -1,
        prefix_tokens: int = 0,
    ) -> Request:
        """Create a request arriving now and enqueue it (it may be dropped by the enqueue guards)."""
        rid = self._next_id
        self._next_id += 1
        req = Request(
            rid,
            self.now,
            prompt,
            output,
            max_output_tokens,
            prefix_group,
            prefix_tokens,
            block_size=self.block_size,
        )
        self.requests[rid] = req
        self.engine.add_request(req, self.now)
        return req

    def computed(self, r: Request) -> int:
        return computed_tokens(self.engine, r)

    def generated(self, r: Request) -> int:
        return generated_tokens(self.engine, r)

    def waiting_ids(self) -> list[int]:
        return [r.id for r in self.engine.waiting]

    def running_ids(self) -> list[int]:
        return [r.id for r in self.engine.running]

    def step(self) -> StepReport:
        engine = self.engine
        live = [r for r in self.requests.values() if r.state in (WAITING, RUNNING)]
        before = {r.id: (r.state, self.computed(r), r.preemptions) for r in live}
        start = self.now
        dt = engine.form_batch(start)
        # An admission starts from its prefix-cache hits: what it computes is counted from there.
        hits = {
            r.id: r.num_computed for r in live if before[r.id][0] == WAITING and r.state == RUNNING
        }
        engine.end_step(start + dt)
        self.now = start + dt
        tokens, preempted, finished = {}, [], []
        for r in live:
            state, computed, preemptions = before[r.id]
            if r.preemptions > preemptions:
                preempted.append(r.id)
                continue
            gained = self.computed(r) - hits.get(r.id, computed)
            if gained > 0:
                tokens[r.id] = gained
            if r.state == FINISHED:
                finished.append(r.id)
        row = {name: int(values[-1]) for name, values in engine.log.as_arrays().items()}
        admitted = sorted(hits, key=lambda rid: self.requests[rid].order)
        return StepReport(start, dt, tokens, admitted, hits, preempted, finished, row)

    def run(self, max_steps: int = 100_000) -> list[StepReport]:
        """Step until the engine has no work left."""
        reports = []
        while self.engine.has_work():
            reports.append(self.step())
            assert len(reports) < max_steps, "the engine did not drain"
        return reports

    def check_kv(self) -> list[str]:
        """The independent block recount (INV-4) over every running request."""
        return self.kv.check(self.engine.kv_owners())
