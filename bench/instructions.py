"""Instructions per simulated request, this checkout against another revision: a comparison that
the machine's load cannot move.

Wall and CPU seconds on a shared 2-core machine drift by ±20% and more under load (the A/B
timings of ``run.py --against`` need a quiet machine to resolve 5%). The number of instructions
a run executes does not depend on the load. This script counts them with valgrind's callgrind
(``apt install valgrind``), for two request counts of a scenario on each side; the difference
between the two counts is the simulation's own work for the extra requests (start-up, imports
and the fixed parts of the audit cancel out). Instructions are a proxy for time, not time: cache
misses and branch mispredictions are not counted, so confirm a large change on a quiet machine.

Usage: python bench/instructions.py --against REV [--only a,b,h] [--requests 1000,3000]

Each run takes about 20 s of CPU under valgrind (50x slower than natively); the runs of one
call go in parallel, two at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import ROOT, SCENARIOS, checkout  # noqa: E402

CHILD = r"""
import json, sys
import servesim
servesim.simulate(servesim.load_scenario(None, ["workload.requests=20"]))
servesim.simulate(servesim.load_scenario(None, json.loads(sys.argv[1])))
"""


def instructions(root: Path, overrides: list[str]) -> int:
    """Instructions executed by one run of ``overrides`` importing servesim from ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONHASHSEED="0")
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            CHILD,
            json.dumps(overrides),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    found = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        sys.exit(f"the run in {root} failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", required=True)
    parser.add_argument("--only", default="a,b,h")
    parser.add_argument("--requests", default="1000,3000", help="two request counts: LOW,HIGH")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt install valgrind (or use run.py --against)")
    keys = args.only.split(",")
    for key in keys:
        if key not in SCENARIOS:
            parser.error(f"--only: unknown scenario {key!r}; known: {', '.join(SCENARIOS)}")
    low, high = (int(n) for n in args.requests.split(","))
    if not 0 < low < high:
        parser.error(f"--requests {args.requests!r}: give LOW,HIGH with 0 < LOW < HIGH")
    with checkout(args.against) as other:
        jobs = {
            (key, side, n): (root, SCENARIOS[key][1] + [f"workload.requests={n}"])
            for key in keys
            for side, root in (("A", ROOT), ("B", other))
            for n in (low, high)
        }
        with ThreadPoolExecutor(max_workers=2) as pool:
            counts = dict(zip(jobs, pool.map(lambda job: instructions(*job), jobs.values())))
    print(
        f"A = this checkout, B = {args.against}; instructions per request over requests {low}..{high}"
    )
    print("| id | A instr/request | B instr/request | A/B |")
    print("|---|---|---|---|")
    for key in keys:
        per = {
            side: (counts[(key, side, high)] - counts[(key, side, low)]) / (high - low)
            for side in ("A", "B")
        }
        print(f"| {key} | {per['A']:,.0f} | {per['B']:,.0f} | {per['A'] / per['B']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
