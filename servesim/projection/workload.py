"""What the projector needs to know about a workload: its rate, the burstiness of its arrivals
and the moments of its request lengths, as one instance sees them.

Moments come from a fixed sample of each length distribution (a seeded generator, the same on
every call), not from closed forms: the sample sees the distribution's clamping, empirical tables
and the engine's caps (``max_model_len``, a fixed ``max_output_tokens``) exactly as the simulator
does, and costs about a millisecond. Several clients mix by their rate shares.

Refused, by name: trace replays (their rate changes over time; project a synthetic workload with
the trace's rate and mean lengths instead), rate stages (a time-varying rate has no steady state),
and multi-round sessions (follow-up rounds reuse the cached conversation, which the projector does
not model).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from servesim.simcore.errors import ScenarioError

SAMPLE_SIZE = 8192
"""Draws per length distribution: the sample mean of a Gaussian preset is within 0.3% of its
mean (std/mean ≈ 0.4, divided by √8192 ≈ 90)."""

SAMPLE_SEED = 20261203
"""Seed of the moment sample: fixed, so a projection is a pure function of the scenario."""


@attrs.frozen
class WorkloadMoments:
    """Per-request averages of one workload (what a single request brings, on average).

    rate           requests per second offered to the whole cluster
    arrival_cv2    squared coefficient of variation of inter-arrival times (Poisson 1, constant 0)
    prompt         mean prompt tokens (shared prefix included)
    computed       mean prompt tokens the engine computes (prompt less the cached shared prefix)
    computed_cv2   squared coefficient of variation of the computed prompt tokens
    output         mean output tokens (after the caps)
    decode_steps   mean decode steps per request, E[output − 1]
    decode_context time-average KV context of a decoding request, E[(O−1)(I + (O−2)/2)] / E[O−1]
    prefix_cached  prompt tokens served from the prefix cache per request (0 without a shared prefix)
    shared_kv      KV tokens the cached shared prefixes hold once per group, whoever uses them
    """

    rate: float
    arrival_cv2: float
    prompt: float
    computed: float
    computed_cv2: float
    output: float
    decode_steps: float
    decode_context: float
    prefix_cached: float
    shared_kv: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def workload_moments(workload: Any, engine: Any, path: str = "workload") -> WorkloadMoments:
    """Moments of ``workload`` under ``engine``'s limits; unsupported workloads are refused by name."""
    from servesim.workloads.spec import WorkloadSpec
    from servesim.workloads.synthetic import SyntheticWorkload

    if isinstance(workload, SyntheticWorkload):
        streams = [(1.0, workload)]
        rate = workload.arrival.rate
    elif isinstance(workload, WorkloadSpec):
        if workload.stages:
            raise ScenarioError(
                f"{path}.stages",
                workload.stages,
                "the projector needs one steady rate; project each stage's rate on its own "
                "(servesim project ... --rate R)",
            )
        streams = [(c.share, c.workload) for c in workload.clients]
        rate = float(workload.rate or 0.0)
    else:
        raise ScenarioError(
            path,
            type(workload).__name__,
            "the projector works from a synthetic workload (preset or length distributions and a "
            "rate); for a trace, project a synthetic workload with the trace's rate and mean "
            "prompt and output lengths",
        )
    if not (rate > 0 and math.isfinite(rate)):
        raise ScenarioError(f"{path}.rate", rate, "the projector needs a positive arrival rate")
    for _, stream in streams:
        if stream.sessions is not None:
            raise ScenarioError(
                f"{path}.sessions",
                stream.sessions.describe(),
                "multi-round sessions are not projected (follow-up rounds reuse cached context); "
                "remove sessions to project single-round requests, or simulate",
            )
    rng = np.random.default_rng(SAMPLE_SEED)
    parts = [_stream_sample(stream, engine, rng) for _, stream in streams]
    shares = np.array([share for share, _ in streams])
    return _mix(parts, shares / shares.sum(), rate, _arrival_cv2(streams))


def _arrival_cv2(streams: list[tuple[float, Any]]) -> float:
    """Share-weighted squared CV of the clients' arrival processes (an unknown CV counts as
    Poisson's 1). Superposing several streams makes traffic more Poisson-like; this ignores that."""
    total = 0.0
    for share, stream in streams:
        cv = stream.arrival.cv
        total += share * (1.0 if cv is None else float(cv) ** 2)
    return total


def _stream_sample(stream: Any, engine: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Prompt, computed-prompt and output token samples of one stream, after the engine's caps.

    Requests whose prompt does not fit ``max_model_len`` are dropped by the simulator; they are
    left out here too. With prefix caching the shared prefix is computed once per group, so
    (after the first request of each group) only the rest of the prompt is computed; the cached
    part is whole blocks, as the block manager caches them."""
    prompt = stream.input.sample(rng, SAMPLE_SIZE).astype(np.float64) + stream.prefix_tokens
    output = stream.output.sample(rng, SAMPLE_SIZE).astype(np.float64)
    keep = prompt < engine.max_model_len
    if not keep.any():
        raise ScenarioError(
            "engine.max_model_len",
            engine.max_model_len,
            "every sampled prompt is at least max_model_len tokens long, so every request would "
            "be dropped; raise max_model_len or shorten the prompts",
        )
    prompt, output = prompt[keep], output[keep]
    cap = engine.max_model_len - prompt
    budget = stream.max_output_tokens
    if isinstance(budget, int) and budget > 0:
        cap = np.minimum(cap, budget)
    output = np.maximum(np.minimum(output, cap), 1.0)
    cached = 0.0
    if engine.enable_prefix_caching and stream.prefix_tokens > 0:
        cached = float(stream.prefix_tokens // engine.block_size * engine.block_size)
    computed = np.maximum(prompt - cached, 1.0)
    shared = cached * stream.prefix_groups  # the cached blocks exist once per group
    return {
        "prompt": prompt,
        "computed": computed,
        "output": output,
        "cached": np.array(cached),
        "shared": np.array(shared),
    }


def _mix(
    parts: list[dict[str, np.ndarray]], shares: np.ndarray, rate: float, arrival_cv2: float
) -> WorkloadMoments:
    def mean(fn) -> float:
        return float(sum(s * np.mean(fn(p)) for s, p in zip(shares, parts, strict=True)))

    prompt = mean(lambda p: p["prompt"])
    computed = mean(lambda p: p["computed"])
    computed_sq = mean(lambda p: p["computed"] ** 2)
    output = mean(lambda p: p["output"])
    steps = mean(lambda p: p["output"] - 1.0)
    weighted = mean(lambda p: (p["output"] - 1.0) * (p["prompt"] + (p["output"] - 2.0) / 2.0))
    context = weighted / steps if steps > 0 else prompt
    return WorkloadMoments(
        rate=rate,
        arrival_cv2=arrival_cv2,
        prompt=prompt,
        computed=computed,
        computed_cv2=max(computed_sq / computed**2 - 1.0, 0.0),
        output=output,
        decode_steps=steps,
        decode_context=context,
        prefix_cached=mean(lambda p: p["cached"]),
        shared_kv=float(sum(float(p["shared"]) for p in parts)),
    )
