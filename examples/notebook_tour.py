"""A notebook, as a script: run a scenario from Python, look at its numbers, its per-request table
and its figures. Paste the cells into Jupyter one by one (the `# %%` markers are cells in VS Code
and Jupytext), or run it whole: `python examples/notebook_tour.py` (figures go to a temporary
folder and are listed at the end).
"""

# %% Run a scenario: the default one, a little shorter, with a per-class latency target
import tempfile
from pathlib import Path

import servesim

scenario = servesim.load_scenario(
    None, ["workload.requests=600", "slo={standard: {ttft: 200ms, itl: 50ms}}"]
)
results = servesim.simulate(scenario)  # audited: an invariant violation raises
print(results)

# %% The summary: the same numbers as summary.json
s = results.summary
print(f"TTFT p50 {s['ttft_p50_ms']:.1f} ms, p99 {s['ttft_p99_ms']:.1f} ms")
print(f"throughput {s['responses_per_sec']:.2f} req/s, {s['tokens_per_sec']:.0f} output tok/s")
print(f"within SLO: {s['goodput']['standard']['slo_attainment']:.1%}")

# %% Per request: numpy arrays, or a pandas DataFrame
r = results.requests
print("requests:", len(r["id"]), "first arrival at", r["arrival_us"].min(), "µs")
df = results.to_pandas()
print(df[["prompt_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms"]].describe().round(1))
slow = df[df.ttft_ms > df.ttft_ms.quantile(0.99)]
print(
    f"the slowest 1% of first tokens: prompts of {slow.prompt_tokens.mean():.0f} tokens on average"
)

# %% Figures: each .plot.* returns a matplotlib Figure (in a notebook it is drawn inline)
figures = [
    results.plot.latency_cdfs(),
    results.plot.latency_over_time(),
    results.plot.instances(),
    results.plot.gantt(instance=0, start_s=0.0, end_s=2.0),
]
out = Path(tempfile.mkdtemp(prefix="servesim-tour-"))
for i, fig in enumerate(figures):
    fig.savefig(out / f"figure{i}.png")
print("figures:", ", ".join(sorted(p.name for p in out.iterdir())), "in", out)

# %% One self-contained HTML page with the summary tables and every figure
page = results.plot.report(out / "report.html")
print("report:", page, f"({page.stat().st_size // 1024} KiB)")
