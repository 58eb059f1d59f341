"""The steady state of one instance at an offered rate: a batch-size fixed point for decoding and
a queueing term for prefill (docs/explanation/projection.md states every formula).

Notation (per instance): λ requests/s; a request computes ``P`` prompt tokens (less a cached
shared prefix) and ``O`` output tokens; ``f(batch)`` is the latency model's step time.

* Decoding (Little's law): ``N = λ · E[O − 1] · T`` requests decode at once, where ``T`` is the
  mean step time a decoding request sees.
* Prefill interleaves with decoding (chunked prefill): a request's prefill adds
  ``W = Σ_chunks f(N, chunk) − f(N, no chunk)`` of work to the steps that carry it, so
  ``T = D(N + 1) / (1 − λ·W(N))`` with ``D(n)`` the step time of ``n`` decoders at their mean
  context (a decoding request sees itself plus ``N`` others).
* ``T`` is solved by bisection on ``F(T) − T`` between the empty-batch step and the step at which
  the decode batch would reach ``max_num_seqs``.

Representative batches use mean lengths: with long-tailed lengths the mean of ``f`` differs from
``f`` of the mean (Jensen's gap); linear models (blackbox) have none.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from servesim.latency.base import BatchSummary
from servesim.projection.workload import WorkloadMoments

_BISECTION_STEPS = 60
_RELATIVE_TOLERANCE = 1e-7


@attrs.frozen
class InstanceLimits:
    """The engine limits the projection obeys (one instance)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    enable_chunked_prefill: bool
    block_size: int
    kv_blocks: int
    watermark_blocks: int

    @classmethod
    def of(cls, engine: Any) -> InstanceLimits:
        """The limits of an engine section: each is the engine field of the same name."""
        return cls(**{field.name: getattr(engine, field.name) for field in attrs.fields(cls)})

    @property
    def kv_tokens(self) -> int:
        return (self.kv_blocks - self.watermark_blocks) * self.block_size


@attrs.frozen
class SteadyState:
    """One instance at per-instance rate ``rate``. Times in µs; ``limit`` names the constraint
    that breaks first when ``sustainable`` is False (then the latencies are ``inf``)."""

    rate: float
    sustainable: bool
    limit: str
    step_us: float
    decode_batch: float
    running: float
    in_system: float
    prefill_utilization: float
    budget_utilization: float
    kv_tokens_used: float
    kv_utilization: float
    prefill_us: float
    residual_us: float
    prefill_queue_us: float
    ttft_us: float
    tpot_us: float
    e2e_us: float


class StepModel:
    """The latency model asked about representative batches of one workload on one instance."""

    def __init__(self, latency: Any, limits: InstanceLimits, w: WorkloadMoments):
        self.latency = latency
        self.limits = limits
        self.w = w
        self._cache: dict[tuple, float] = {}

    def _step(self, decoders: int, chunk: tuple[int, int] | None = None) -> float:
        """f(``decoders`` at the mean decode context, plus one prefill chunk (before, new))."""
        key = (decoders, chunk)
        if key not in self._cache:
            context = int(round(decoders * self.w.decode_context))
            if chunk is None:
                batch = BatchSummary(0, (), decoders, context)
            else:
                before, new = chunk
                prompt = int(round(self.w.prompt))
                batch = BatchSummary(new, ((before, new, prompt),), decoders, context)
            self._cache[key] = float(self.latency.step_time_us(batch))
        return self._cache[key]

    def decode(self, n: float) -> float:
        """D(n): the step time of ``n`` decoders, linear between whole batch sizes (n ≥ 1)."""
        n = min(max(n, 1.0), float(self.limits.max_num_seqs))
        lo = int(math.floor(n))
        hi = min(lo + 1, self.limits.max_num_seqs)
        frac = n - lo
        low = self._step(lo)
        return low if frac == 0 or hi == lo else low + frac * (self._step(hi) - low)

    def chunk_size(self, decoders: float) -> int:
        """Prompt tokens a step can take beside ``decoders`` decode tokens (vLLM v1 schedules
        running decodes first, then prefill chunks in the rest of the budget)."""
        room = self.limits.max_num_batched_tokens - int(round(decoders))
        if self.limits.long_prefill_token_threshold > 0:
            room = min(room, self.limits.long_prefill_token_threshold)
        if not self.limits.enable_chunked_prefill:
            room = max(room, int(math.ceil(self.w.computed)))  # whole prompts only
        return max(room, 1)

    def chunks(self, decoders: float) -> list[tuple[int, int]]:
        """(tokens before, new tokens) of each chunk of a mean prompt's prefill."""
        total = max(int(round(self.w.computed)), 1)
        size = self.chunk_size(decoders)
        start = int(round(self.w.prefix_cached))
        out = []
        done = 0
        while done < total:
            new = min(size, total - done)
            out.append((start + done, new))
            done += new
        return out

    def full_chunk_step(self, decoders: float) -> float:
        """f(``decoders``, one chunk filling the rest of the budget): a step that is all prefill."""
        n = max(int(round(decoders)), 1)
        return self._step(n, (int(round(self.w.prefix_cached)), self.chunk_size(decoders)))

    def prefill(self, decoders: float) -> tuple[float, float]:
        """(marginal work W, own prefill time S) of a mean prompt beside ``decoders`` decoders.

        At least one decoder is assumed: the step time of an empty batch is no model's concern,
        so a marginal cost over it would count the whole step as prefill work."""
        n = max(int(round(decoders)), 1)
        base = self._step(n)
        own = 0.0
        for chunk in self.chunks(decoders):
            own += self._step(n, chunk)
        pieces = len(self.chunks(decoders))
        return own - pieces * base, own


def steady_state(model: StepModel, rate: float) -> SteadyState:
    """The steady state of the instance at ``rate`` requests/s (see the module docstring)."""
    w, limits = model.w, model.limits
    lam = rate / 1e6  # per µs
    steps = w.decode_steps

    def decoders(t: float) -> float:
        return lam * steps * t

    def fixed_point_map(t: float) -> float:
        n = decoders(t)
        work, _ = model.prefill(n)
        share = lam * work
        return math.inf if share >= 1 else model.decode(n + 1) / (1 - share)

    t_low = fixed_point_map(0.0)
    t_cap = limits.max_num_seqs / (lam * steps) if steps > 0 else math.inf
    if steps <= 0:
        t = t_low
    elif t_low >= t_cap or fixed_point_map(t_cap) > t_cap:
        return _unsustainable(rate, _why_no_fixed_point(model, lam, t_cap))
    else:
        # from 0, not t_low: F need not be monotone (a prefill's chunks share steps with more
        # decoders as T grows, so its marginal work can fall), and F(0) - 0 > 0 always holds
        t = _bisect(lambda x: fixed_point_map(x) - x, 0.0, t_cap)
    if not math.isfinite(t):
        return _unsustainable(rate, "prefill: prefill work fills every step (λ·W ≥ 1)")
    return _state(model, rate, t)


def _why_no_fixed_point(model: StepModel, lam: float, t_cap: float) -> str:
    work, _ = model.prefill(lam * model.w.decode_steps * t_cap)
    if lam * work >= 1:
        return "prefill: prefill work fills every step (λ·W ≥ 1)"
    return (
        f"max_num_seqs: no steady state with at most {model.limits.max_num_seqs} requests decoding"
    )


def _bisect(g, lo: float, hi: float) -> float:
    """The root of ``g`` in [lo, hi] given g(hi) ≤ 0 (g is F(T) − T, F increasing; lo when
    g(lo) ≤ 0 already)."""
    if g(lo) <= 0:
        return lo
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if g(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= _RELATIVE_TOLERANCE * hi:
            break
    return hi


def _state(model: StepModel, rate: float, t: float) -> SteadyState:
    """Latencies and occupancy at the solved mean step time ``t`` (µs)."""
    w, limits, latency = model.w, model.limits, model.latency
    lam = rate / 1e6
    n = lam * w.decode_steps * t
    work, own = model.prefill(n)
    prefill_share = lam * work
    # The token budget as a FCFS server of prompt tokens: a prompt holds it for its share of
    # full-chunk steps, X = (P / chunk) · f(N, one full chunk); ρ = λ·E[X].
    chunk = model.chunk_size(n)
    hold = w.computed / chunk * model.full_chunk_step(n)
    budget_share = lam * hold
    residual = _residual(t, prefill_share, lam * t * len(model.chunks(n)))
    queue = _prefill_queue(budget_share, hold, w.computed_cv2, w.arrival_cv2)
    alpha2 = float(latency.output_token_time_us)
    ttft = float(latency.queueing_time_us(int(round(w.prompt)))) + residual + queue + own + alpha2
    tpot = t + alpha2
    e2e = ttft + w.decode_steps * tpot + float(latency.post_decode_overhead_us)
    running = n + lam * own
    kv_used = n * request_kv_tokens(w, limits) + lam * own * (w.prompt - w.prefix_cached)
    kv_used += w.shared_kv
    kv_share = kv_used / limits.kv_tokens if limits.kv_tokens > 0 else math.inf
    limit = ""
    if budget_share >= 1:
        limit = "token budget: prefill tokens per step exceed max_num_batched_tokens"
    elif running > limits.max_num_seqs:
        limit = f"max_num_seqs: {running:.0f} requests would run at once"
    elif kv_share > 1:
        limit = "kv cache: the running requests' KV exceeds the cache (preemptions)"
    state = SteadyState(
        rate=rate,
        sustainable=not limit,
        limit=limit or "none",
        step_us=t,
        decode_batch=n,
        running=running,
        in_system=lam * e2e,
        prefill_utilization=prefill_share,
        budget_utilization=budget_share,
        kv_tokens_used=kv_used,
        kv_utilization=kv_share,
        prefill_us=own,
        residual_us=residual,
        prefill_queue_us=queue,
        ttft_us=ttft,
        tpot_us=tpot,
        e2e_us=e2e,
    )
    return state if not limit else _unsustainable(rate, limit, state)


def request_kv_tokens(w: WorkloadMoments, limits: InstanceLimits) -> float:
    """KV tokens a decoding request holds on its own, on average: its mean context and the token
    being computed, less the cached shared prefix (held once per group, ``w.shared_kv``), plus
    half a block of rounding."""
    return w.decode_context - w.prefix_cached + 1 + limits.block_size / 2


def _residual(t: float, prefill_share: float, chunks_per_step: float) -> float:
    """Mean remaining time of the step in flight when a request arrives: E[τ²] / (2 E[τ]) over
    step durations τ. A share q = min(1, chunks per step) of steps carries prefill and is longer
    by the prefill work spread over them."""
    if t <= 0:
        return 0.0
    q = min(1.0, chunks_per_step)
    plain = t * (1 - prefill_share)
    extra = t * prefill_share / q if q > 0 else 0.0
    second = (1 - q) * plain**2 + q * (plain + extra) ** 2
    return second / (2 * t)


def _prefill_queue(budget_share: float, hold: float, size_cv2: float, arrival_cv2: float) -> float:
    """Wait for the prefills ahead (FCFS through the token budget): Kingman's G/G/1 form of the
    Pollaczek–Khinchine mean, ``ρ/(1−ρ) · (c_a² + c_s²)/2 · E[X]``, with ``X`` the time a prompt
    holds the budget and ``c_s²`` taken from the prompt lengths (X is about linear in them)."""
    if budget_share <= 0:
        return 0.0
    if budget_share >= 1:
        return math.inf
    return budget_share / (1 - budget_share) * (arrival_cv2 + size_cv2) / 2 * hold


def _unsustainable(rate: float, limit: str, state: SteadyState | None = None) -> SteadyState:
    inf = math.inf
    if state is not None:
        return attrs.evolve(
            state, sustainable=False, limit=limit, ttft_us=inf, e2e_us=inf, in_system=inf
        )
    return SteadyState(
        rate=rate,
        sustainable=False,
        limit=limit,
        step_us=inf,
        decode_batch=inf,
        running=inf,
        in_system=inf,
        prefill_utilization=inf,
        budget_utilization=inf,
        kv_tokens_used=inf,
        kv_utilization=inf,
        prefill_us=inf,
        residual_us=inf,
        prefill_queue_us=inf,
        ttft_us=inf,
        tpot_us=inf,
        e2e_us=inf,
    )


def max_sustainable_rate(model: StepModel, start: float) -> tuple[float, str]:
    """(the largest per-instance rate with a steady state, the limit that binds just above it),
    to a relative precision of 1e-3, by doubling then bisection from ``start`` requests/s."""
    lo, hi = 0.0, max(start, 1e-3)
    limit = "none"
    while True:
        s = steady_state(model, hi)
        if not s.sustainable:
            limit = s.limit
            break
        lo, hi = hi, hi * 2
        if hi > 1e7:
            return math.inf, "none"
    while hi - lo > 1e-3 * hi:
        mid = 0.5 * (lo + hi)
        s = steady_state(model, mid)
        if s.sustainable:
            lo = mid
        else:
            hi, limit = mid, s.limit
    return lo, limit
