"""Running points: :func:`run_point` (the pure function every backend calls) and the serial,
process-pool and Ray backends.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from servesim.simcore.errors import ScenarioError
from servesim.studies.sweep.metrics import metric_value
from servesim.studies.sweep.points import override_strings
from servesim.studies.sweep.spec import Point

BACKENDS = ("process", "serial", "ray")
RAY_HINT = "pip install 'servesim[ray]'"

# ---------------------------------------------------------------------- running one point


def run_point(
    base_source: str | Path | Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    metrics: Sequence[str],
) -> dict[str, Any]:
    """Simulate one point: the base scenario with ``overrides`` (seed included) applied in order.

    Pure: the result depends only on the arguments, whatever process or machine runs it.
    Returns ``{"metrics": {name: value}, "summary": the full summary, "wall_s": seconds}``.
    Raises what the run raises (AuditError for a broken invariant), and KeyboardInterrupt if
    the run was interrupted (its partial summary is not a result).
    """
    from servesim.run import simulate
    from servesim.scenario import load_scenario

    started = time.perf_counter()
    scenario = load_scenario(base_source, override_strings(overrides))
    summary = simulate(scenario).summary
    if summary.get("interrupted"):
        raise KeyboardInterrupt
    return {
        "metrics": {m: metric_value(summary, m) for m in metrics},
        "summary": summary,
        "wall_s": time.perf_counter() - started,
    }


def _attempt(
    base_source: Any, overrides: Mapping[str, Any], metrics: Sequence[str], log_level: str | None
) -> dict[str, Any]:
    """run_point, with an exception turned into ``{"error": one line, "traceback": text}``.

    ``log_level`` configures the logs of a Ray worker (None: leave this process's logging be).
    """
    if log_level is not None:
        from servesim.simcore.log import configure

        configure(log_level)
    try:
        return run_point(base_source, overrides, metrics)
    except Exception as exc:
        message = " ".join(f"{exc.__class__.__name__}: {exc}".split())
        return {"error": message, "traceback": traceback.format_exc()}


def _init_worker(log_level: str, parent: int) -> None:
    """Pool workers leave Ctrl-C to the driver, which lets running points finish, and exit on
    their own if the driver ``parent`` dies (killed with SIGKILL, nothing left to collect their
    work). The driver's pid is given, not read here: a driver killed between a worker's fork and
    this call would otherwise be replaced by the reaper's pid, and the worker would never leave."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="servesim-orphan-watch", daemon=True).start()
    from servesim.simcore.log import configure

    configure(log_level)


# ---------------------------------------------------------------------- backends


_ORPHAN_CHECK_S = 0.5
"""How often a pool worker checks that the sweep driving it is still alive."""


class _Lost(Exception):
    """The worker running a point died (the process pool broke)."""


class _SerialBackend:
    """Runs a point when it is submitted, in this process."""

    limit = 1

    def __init__(self, job: Callable[[Point], tuple]):
        self.job = job
        self.done: dict[int, dict] = {}

    def submit(self, point: Point) -> int:
        self.done[point.index] = _attempt(*self.job(point), None)
        return point.index

    def wait(self, handles: list) -> list:
        return handles

    def outcome(self, handle: int) -> dict:
        return self.done.pop(handle)

    def restart(self) -> None:
        self.done.clear()

    def abandon(self, handles: Iterable) -> None:
        self.done.clear()

    def close(self) -> None:
        self.done.clear()


class _PoolBackend:
    """A ProcessPoolExecutor; a broken pool (a worker died) is replaced by a new one."""

    def __init__(self, job: Callable[[Point], tuple], log_level: str, workers: int):
        self.job = job
        self.log_level = log_level
        self.limit = workers
        self.abandoned = False
        self.executor = self._new()

    def _new(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=self.limit, initializer=_init_worker, initargs=(self.log_level, os.getpid())
        )

    def submit(self, point: Point) -> concurrent.futures.Future:
        try:
            return self.executor.submit(_attempt, *self.job(point), None)  # _init_worker configured
        except concurrent.futures.process.BrokenProcessPool as exc:
            # a worker died between the last wait and this submit: the point did not start;
            # hand back a failed future so the runner restarts the pool and runs it again
            lost: concurrent.futures.Future = concurrent.futures.Future()
            lost.set_exception(exc)
            return lost

    def wait(self, handles: list) -> list:
        done, _ = concurrent.futures.wait(handles, return_when=concurrent.futures.FIRST_COMPLETED)
        return list(done)

    def outcome(self, handle: concurrent.futures.Future) -> dict:
        try:
            return handle.result()
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise _Lost(str(exc)) from None

    def restart(self) -> None:
        self.executor.shutdown(wait=True)
        self.executor = self._new()

    def abandon(self, handles: Iterable) -> None:
        """Stop now: cancel what has not started and terminate the workers."""
        workers = dict(getattr(self.executor, "_processes", None) or {})
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in workers.values():
            with contextlib.suppress(Exception):
                process.terminate()
        self.abandoned = True

    def close(self) -> None:
        self.executor.shutdown(wait=not self.abandoned, cancel_futures=True)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ScenarioError(
            "--backend", "ray", f"Ray is not installed: {RAY_HINT} (or use --backend process)"
        ) from None
    return ray


class _RayBackend:
    """Ray tasks (one CPU each) calling the same function as the other backends."""

    def __init__(
        self,
        job: Callable[[Point], tuple],
        log_level: str,
        workers: int | None,
        address: str | None,
    ):
        ray = _import_ray()
        self.ray = ray
        self.job = job
        self.log_level = log_level
        self.started = not ray.is_initialized()
        if self.started:
            import logging

            options: dict[str, Any] = {"logging_level": logging.WARNING}
            if address is None:
                options["include_dashboard"] = False
            try:
                ray.init(address=address, **options)
            except Exception as exc:
                raise ScenarioError(
                    "--ray-address" if address else "--backend",
                    address or "ray",
                    f"cannot start or reach a Ray cluster ({exc.__class__.__name__}: {exc})",
                ) from None
        self.task = ray.remote(num_cpus=1)(_attempt)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.limit = workers or max(1, cpus)

    def submit(self, point: Point) -> Any:
        return self.task.remote(*self.job(point), self.log_level)

    def wait(self, handles: list) -> list:
        done, _ = self.ray.wait(handles, num_returns=1)
        return done

    def outcome(self, handle: Any) -> dict:
        try:
            return self.ray.get(handle)
        except Exception as exc:  # the task never returned (a worker or node died, cancelled)
            message = " ".join(f"{exc.__class__.__name__}: {exc}".split())
            return {"error": message, "traceback": message}

    def restart(self) -> None:
        return None

    def abandon(self, handles: Iterable) -> None:
        for ref in handles:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
