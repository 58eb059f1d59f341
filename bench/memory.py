"""Peak memory of long runs: the flat-memory target (a 10M-request run peaks under 1 GB).

Each size runs in a fresh Python process (so its peak RSS is its own): simulate with the audit,
then write the results directory (streamed requests.csv, timeseries.csv, steps.npz) into a
temporary directory. Reported: wall seconds of the simulation (with its audit and summary) and of
the writing, and the process's peak resident set (``ru_maxrss``) after each phase.

  1m   1,000,000 requests (the usual check)                          peak RSS < 1 GB
  10m  10,000,000 requests (the target; about 6-10 minutes)          peak RSS < 1 GB

Both: 4 instances, the chatbot preset at ~80% load (26 req/s each), blackbox latency,
fast-forward on (the defaults).

Usage: python bench/memory.py [--only 1m,10m] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

TARGET_MB = 1024
SIZES = {"1m": 1_000_000, "10m": 10_000_000}
INSTANCES = 4

CHILD = r"""
import json, resource, sys, tempfile, time
import servesim
requests, instances, write = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
scenario = servesim.load_scenario(None, [
    f"cluster.instances={instances}",
    f"workload.rate={26 * instances}",
    f"workload.requests={requests}",
])
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
results = servesim.simulate(scenario)
sim_s = time.perf_counter() - t0
sim_rss = rss_mb()
write_s = 0.0
if write:
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        results.write(f"{tmp}/out")
        write_s = time.perf_counter() - t1
s = results.summary
print(json.dumps({
    "requests": s["injected_requests"],
    "completed": s["completed_requests"],
    "steps": s["steps"],
    "audit": s["audit"].get("passed"),
    "spilled": results.record.requests.spilled,
    "sim_s": sim_s,
    "write_s": write_s,
    "sim_rss_mb": sim_rss,
    "peak_rss_mb": rss_mb(),
}))
"""


def measure(requests: int, write: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(requests), str(INSTANCES), "1" if write else "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="1m", help="comma-separated sizes: 1m, 10m")
    parser.add_argument("--no-write", action="store_true", help="simulate only")
    args = parser.parse_args()
    failed = False
    print(
        "| size | requests | steps | audit | sim s | write s | peak RSS after sim MB "
        "| peak RSS MB | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key in args.only.split(","):
        r = measure(SIZES[key], not args.no_write)
        ok = r["peak_rss_mb"] < TARGET_MB
        failed |= not ok
        print(
            f"| {key} | {r['requests']:,} | {r['steps']:,} | {'yes' if r['audit'] else 'NO'} "
            f"| {r['sim_s']:.0f} | {r['write_s']:.0f} | {r['sim_rss_mb']:,.0f} "
            f"| {r['peak_rss_mb']:,.0f} | {'PASS' if ok else 'FAIL'} < {TARGET_MB} MB |",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
