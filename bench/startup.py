"""servesim start-up: how long ``servesim run`` of a tiny scenario takes, and what its imports cost.

Target (issue 16): the whole process, from the interpreter starting to the summary printed and
the results written, in under 0.2 s (median wall time over ``--runs`` fresh processes).

It prints
  1. the top ``python -X importtime`` entries of that run (self time, the smallest over
     ``--importtime-runs`` runs, so a busy moment on a shared machine does not put a module on
     the list);
  2. the median, smallest and largest wall time (and CPU time) of the run, next to the same
     figures for an interpreter that only imports the libraries every run needs (numpy, PyYAML,
     attrs, SimPy): the part of start-up that is not servesim's own;
  3. PASS or FAIL against the target (exit status 1 on FAIL).

Every process gets a fresh bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary directory,
filled by a first run that is not counted): the figures are those of an installed package, with
compiled modules, whatever ``PYTHONDONTWRITEBYTECODE`` says, and the source tree is not written to.
The two commands run in turn (run, libraries, run, ...), so a change in the machine's load hits
both alike.

Usage: python bench/startup.py [--runs N] [--importtime-runs N] [--top K] [--target SECONDS]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.2

RUN = "import sys; from servesim.cli import run_main; sys.argv[0] = 'servesim'; run_main()"
"""What the ``servesim`` console script does."""

LIBRARIES = (
    "import os; os.environ.setdefault('OPENBLAS_NUM_THREADS', '1'); "
    "import numpy.random, yaml, attrs, simpy"
)
"""The third-party imports every run needs: the floor under servesim's own start-up. With
OpenBLAS on one thread, as the console script sets it before numpy loads (its thread pool's
start is not a cost of the libraries a run needs)."""


def tiny_run_args(out_dir: Path) -> list[str]:
    """``servesim run`` of the default scenario cut to one request, writing its results."""
    return ["run", "--requests", "1", "--no-progress", "--out", str(out_dir)]


def clean_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    return env


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``command`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def importtime_table(command: list[str], env: dict[str, str], repeat: int) -> dict[str, int]:
    """Module -> self import time in µs, the smallest over ``repeat`` runs of ``command``."""
    best: dict[str, int] = {}
    for _ in range(repeat):
        done = subprocess.run(
            [command[0], "-X", "importtime", *command[1:]],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, _, name = line.removeprefix("import time:").split("|")
            module = name.strip()
            best[module] = min(best.get(module, 1 << 62), int(self_us))
    return best


def by_package(table: dict[str, int]) -> dict[str, int]:
    """Self times summed per top-level package (servesim per subpackage)."""
    sums: dict[str, int] = {}
    for module, us in table.items():
        parts = module.split(".")
        key = ".".join(parts[:2]) if parts[0] == "servesim" else parts[0]
        sums[key] = sums.get(key, 0) + us
    return sums


def print_imports(table: dict[str, int], top: int, runs: int) -> None:
    total = sum(table.values())
    print(
        f"python -X importtime, servesim run (self time, smallest of {runs} runs): "
        f"{total / 1e3:.1f} ms"
    )
    print(f"  top {top} modules                                  by package")
    modules = sorted(table.items(), key=lambda kv: -kv[1])[:top]
    packages = sorted(by_package(table).items(), key=lambda kv: -kv[1])[:top]
    for (module, us), (package, pus) in zip(modules, packages, strict=False):
        print(f"  {us / 1e3:6.1f} ms  {module:<38} {pus / 1e3:6.1f} ms  {package}")
    print("  (importtime adds its own overhead: these sum to more than an untimed start-up)")


def summary(label: str, walls: list[float], cpus: list[float]) -> str:
    return (
        f"{label:<30} median {statistics.median(walls):.3f} s wall (min {min(walls):.3f}, "
        f"max {max(walls):.3f}); CPU median {statistics.median(cpus):.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=11, help="timed runs of each command")
    parser.add_argument(
        "--importtime-runs", type=int, default=5, help="-X importtime runs (smallest kept)"
    )
    parser.add_argument("--top", type=int, default=15, help="import-time entries to print")
    parser.add_argument("--target", type=float, default=TARGET_S, help="wall-time target, s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="servesim-startup-") as tmp:
        env = clean_env(Path(tmp) / "pycache")
        run = [sys.executable, "-c", RUN, *tiny_run_args(Path(tmp) / "results")]
        libraries = [sys.executable, "-c", LIBRARIES]
        timed(run, env)  # fills the bytecode cache; not counted
        timed(libraries, env)
        table = importtime_table(run, env, args.importtime_runs)
        print_imports(table, args.top, args.importtime_runs)
        runs: list[tuple[float, float]] = []
        floor: list[tuple[float, float]] = []
        for _ in range(args.runs):
            runs.append(timed(run, env))
            floor.append(timed(libraries, env))
    wall = statistics.median(w for w, _ in runs)
    print()
    print(f"servesim {' '.join(tiny_run_args(Path('DIR')))}, {args.runs} runs each, in turn:")
    print(summary("  servesim run (whole process)", [w for w, _ in runs], [c for _, c in runs]))
    print(summary("  libraries only", [w for w, _ in floor], [c for _, c in floor]))
    ok = wall < args.target
    print(f"{'PASS' if ok else 'FAIL'}: median {wall:.3f} s {'<' if ok else '>='} {args.target} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
