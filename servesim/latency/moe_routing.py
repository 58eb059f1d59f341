"""Which routed experts a mixture-of-experts step reads, and how its routed work splits over the
GPUs of an expert group.

A MoE layer sends each token to ``k`` of its ``E`` routed experts. A step reads the weights of
only the experts its tokens touch: one decoding request reads ``k`` experts per layer, a large
batch reads them all. With expert parallelism each GPU holds ``E/G`` of them and computes the
tokens routed to its own; the group steps together, so the busiest GPU sets the step.

**Popularity.** Expert ``i`` (in order of popularity) is chosen by a token with probability
``p_i ∝ 1/i^s``, a Zipf law of exponent ``s`` (``expert_skew``). ``s = 0`` is the uniform
router that MoE training's load-balancing loss aims for, and what BLIS's roofline assumes
(``spec/blis_reference.md`` §3.2, ``nEff``); it is the default. A token's top-k holds expert
``i`` with probability ``q_i = min(1, k·p_i)`` (exactly ``k/E`` when uniform).

**Experts touched** by ``T`` tokens (expected)::

    nEff(T) = Σ_i 1 − (1 − q_i)^T          uniform: E·(1 − (1 − k/E)^T)

and on one GPU of the group ``nEff(T)/G``: vLLM places experts by id (``linear``), which says
nothing about popularity, so each GPU holds a random share of the popular ones.

**Busiest GPU's share** of the routed work: ``E[max_g Σ_{i∈g} q_i] / k`` over placements of the
popularities on the ``G`` GPUs, ``1/G`` when uniform. For ``s > 0`` it is tabulated once per
``(E, k, s, G)`` from 4,096 seeded random placements (deterministic). The token-to-token
(multinomial) spread of a finite batch around these expectations is not modelled: at a decode
batch of 128 over 128 experts it is a few per cent of one GPU's share.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from servesim.simcore.errors import ScenarioError

PLACEMENT_DRAWS = 4096
"""Random expert placements averaged for the busiest GPU's share (``s > 0`` only)."""
PLACEMENT_SEED = 20240611
"""Seed of those placements: the table is the same on every run and machine."""


def check_skew(value: float, path: str) -> float:
    """``expert_skew`` validated: a finite Zipf exponent ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(path, value, "expected a number >= 0 (Zipf exponent; 0 = uniform)")
    if not (math.isfinite(value) and value >= 0):
        raise ScenarioError(
            path, value, "must be a finite number >= 0 (Zipf exponent; 0 = uniform)"
        )
    return float(value)


@functools.lru_cache(maxsize=64)
def pick_probabilities(experts: int, k: int, skew: float) -> tuple[float, ...]:
    """``q_i``: the probability that one token's top-k holds expert ``i`` (most popular first);
    they sum to ``k``: a token always picks ``k`` distinct experts. ``q_i = min(1, c·i^-skew)``
    with ``c`` such that the sum is ``k`` (water-filling): an expert popular enough to be in every
    token's top-k is capped at 1 and its excess goes to the next ones, so a very large skew
    tends to the same ``k`` experts for every token, and 0 is uniform (``k / experts`` each)."""
    if experts < 1 or not 1 <= k <= experts:
        raise ValueError(f"need 1 <= k <= experts, got k={k}, experts={experts}")
    if skew == 0:
        return (k / experts,) * experts
    weights = np.arange(1, experts + 1, dtype=np.float64) ** -skew
    tail = np.cumsum(weights[::-1])[::-1]  # tail[j] = sum of weights[j:]
    for capped in range(k):  # the `capped` most popular experts are at 1
        c = (k - capped) / tail[capped]
        if c * weights[capped] <= 1.0:
            break
    else:
        capped, c = k, 0.0
    q = np.minimum(1.0, c * weights)
    q[:capped] = 1.0
    return tuple(float(x) for x in q)


class ExpertRouting:
    """The routing statistics of one MoE model on one expert group of ``gpus`` GPUs."""

    def __init__(self, experts: int, k: int, skew: float = 0.0, gpus: int = 1):
        self.experts = int(experts)
        self.k = int(k)
        self.skew = float(skew)
        self.gpus = max(1, int(gpus))
        self._q = np.asarray(pick_probabilities(self.experts, self.k, self.skew))
        self._miss = 1.0 - self.k / self.experts  # uniform: P(a token misses a given expert)
        self.busiest_share = busiest_share(self.experts, self.k, self.skew, self.gpus)

    def touched(self, tokens: float) -> float:
        """Expected distinct experts (of all ``E``) that ``tokens`` tokens route to."""
        if tokens <= 0:
            return 0.0
        if self.skew == 0:
            return self.experts * (1.0 - self._miss**tokens)
        return _touched_skewed(self._q.tobytes(), float(tokens))

    def touched_per_gpu(self, tokens: float) -> float:
        """Expected distinct experts one GPU of the group reads for ``tokens`` tokens."""
        return self.touched(tokens) / self.gpus

    def describe(self) -> dict[str, float | int]:
        return {
            "expert_skew": self.skew,
            "busiest_gpu_share": round(self.busiest_share, 6),
            "experts_touched_by_1_token": round(self.touched(1), 3),
        }


@functools.lru_cache(maxsize=4096)
def _touched_skewed(q_bytes: bytes, tokens: float) -> float:
    q = np.frombuffer(q_bytes, dtype=np.float64)
    return float(np.sum(1.0 - (1.0 - q) ** tokens))


@functools.lru_cache(maxsize=64)
def busiest_share(experts: int, k: int, skew: float, gpus: int) -> float:
    """Expected share of a step's routed picks that the busiest of ``gpus`` GPUs computes, each
    holding ``experts/gpus`` experts placed without regard to popularity (``1/gpus`` when
    uniform, 1 for one GPU)."""
    if gpus <= 1:
        return 1.0
    if skew == 0 or experts % gpus:
        return 1.0 / gpus
    q = np.asarray(pick_probabilities(experts, k, skew))
    rng = np.random.default_rng(PLACEMENT_SEED)
    order = np.argsort(rng.random((PLACEMENT_DRAWS, experts)), axis=1)
    loads = q[order].reshape(PLACEMENT_DRAWS, gpus, experts // gpus).sum(axis=2)
    return float(loads.max(axis=1).mean() / q.sum())
