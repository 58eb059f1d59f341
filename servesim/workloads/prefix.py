"""Shared-prefix groups of a synthetic stream: how long the prefix is, how many groups share one,
and how popular each group is.

Scenario schema (the ``prefix:`` field of a synthetic workload or of a workload-spec client)::

    prefix: {tokens: 512, groups: 40}                      # uniform: every group equally likely
    prefix: {tokens: 512, groups: 40, popularity: {zipf: 1.1}}
    prefix: {hit_rate: 0.6, groups: 40}                    # tokens chosen to reach the hit rate

Popularity. ``uniform`` (the default) draws each request's group uniformly. ``{zipf: s}`` gives
group ``k`` (0-based) the probability ``(k + 1)^-s / H``, ``H = Σ_j (j + 1)^-s``: a few hot system
prompts and a long tail, as in production chat fleets. ``s = 0`` is uniform in law (but draws
differently); larger ``s`` concentrates the traffic on group 0.

Target hit rate. ``hit_rate: h`` asks for the prefix length that makes the *ideal* prefix-cache
hit rate of the stream equal ``h``: the fraction of all prompt tokens that an unbounded cache could
serve, i.e. every request whose group was already seen reuses its ``tokens`` shared tokens. With
``N`` requests, mean sampled input ``μ`` (the part after the prefix) and ``D(N)`` the expected
number of distinct groups among ``N`` draws (``Σ_k 1 - (1 - p_k)^N``), that rate is
``(N - D) · P / (N · (P + μ))``; solving for the prefix length gives
``P = h · μ / ((N - D) / N - h)``, rounded to whole tokens. Without a request count (a duration
only) ``N`` is the expected count ``rate × duration``. A target that no prefix length can reach
(too many groups for too few requests) is an error that says the largest reachable rate. What a
real run achieves is lower when the cache evicts (finite KV) and higher when sessions reuse their
own context; the summary's ``prefix_cached_token_fraction`` reports the achieved rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from servesim.simcore.config import as_float, as_int, check_keys, expect_mapping
from servesim.simcore.errors import ScenarioError

FIELDS = ("tokens", "groups", "popularity", "hit_rate")


@attrs.frozen
class PrefixGroups:
    """``tokens`` shared tokens per group, ``groups`` groups, drawn by ``zipf`` (None: uniform)."""

    tokens: int = 0
    groups: int = 1
    zipf: float | None = None
    hit_rate: float | None = None  # the target this length was solved for, if any

    @property
    def probabilities(self) -> np.ndarray:
        """Each group's draw probability."""
        if self.zipf is None:
            return np.full(self.groups, 1.0 / self.groups)
        weights = np.arange(1, self.groups + 1, dtype=float) ** -self.zipf
        return weights / weights.sum()

    def cdf(self) -> np.ndarray | None:
        """The cumulative probabilities the Zipf draw inverts (None for uniform draws)."""
        if self.zipf is None or self.groups == 1:
            return None
        cdf = np.cumsum(self.probabilities)
        cdf[-1] = 1.0
        return cdf

    def draw(self, rng: np.random.Generator, n: int, cdf: np.ndarray | None) -> np.ndarray:
        """``n`` group ids. Uniform draws keep the stream's historical values (``integers``); Zipf
        draws invert ``cdf`` (from :meth:`cdf`, computed once per stream) with one uniform each."""
        if self.groups == 1:
            return np.zeros(n, dtype=np.int64)
        if cdf is None:
            return rng.integers(0, self.groups, n, dtype=np.int64)
        return np.searchsorted(cdf, rng.random(n), side="right").astype(np.int64)

    def expected_distinct(self, n: float) -> float:
        """Expected number of distinct groups among ``n`` independent draws (inf n: all groups)."""
        if not np.isfinite(n):
            return 0.0 if n < 0 else float(self.groups)
        return float(np.sum(-np.expm1(n * np.log1p(-np.minimum(self.probabilities, 1 - 1e-16)))))

    def ideal_hit_rate(self, mean_input: float, n: float) -> float:
        """The fraction of prompt tokens an unbounded prefix cache serves over ``n`` requests."""
        if self.tokens == 0 or n <= 0:
            return 0.0
        reuse = 1.0 if not np.isfinite(n) else 1.0 - self.expected_distinct(n) / n
        return reuse * self.tokens / (self.tokens + mean_input)

    def solved_for(self, mean_input: float | None, n: float, path: str) -> PrefixGroups:
        """This prefix with ``tokens`` chosen to reach :attr:`hit_rate` (itself if no target)."""
        if self.hit_rate is None:
            return self
        if mean_input is None:
            raise ScenarioError(
                f"{path}.hit_rate",
                self.hit_rate,
                "the input length distribution has no known mean; give prefix.tokens instead",
            )
        reuse = 1.0 if not np.isfinite(n) else 1.0 - self.expected_distinct(n) / n
        if self.hit_rate >= reuse:
            raise ScenarioError(
                f"{path}.hit_rate",
                self.hit_rate,
                f"unreachable: with {self.groups} group(s) over about {n:g} requests, "
                f"{1 - reuse:.1%} of requests are a group's first and miss, so the hit rate stays "
                f"below {reuse:.3f}; lower hit_rate, use fewer groups or more requests",
            )
        tokens = max(1, round(self.hit_rate * mean_input / (reuse - self.hit_rate)))
        return attrs.evolve(self, tokens=tokens)

    def describe(self) -> dict[str, Any] | None:
        if self.tokens <= 0:
            return None
        out: dict[str, Any] = {"tokens": self.tokens, "groups": self.groups}
        if self.zipf is not None:
            out["popularity"] = {"zipf": self.zipf}
        if self.hit_rate is not None:
            out["hit_rate_target"] = self.hit_rate
        return out

    @classmethod
    def from_config(cls, value: Any, path: str) -> PrefixGroups:
        """Validate a ``prefix:`` mapping (module docstring); ``None`` means no shared prefix."""
        if value is None:
            return cls()
        prefix = expect_mapping(value, path)
        check_keys(prefix, FIELDS, path)
        has_tokens, has_rate = "tokens" in prefix, "hit_rate" in prefix
        if has_tokens == has_rate:
            raise ScenarioError(
                f"{path}.tokens",
                None if not has_tokens else prefix["tokens"],
                "give exactly one of tokens (the shared prefix length) or hit_rate (a target "
                "ideal prefix-cache hit rate in [0, 1) the length is solved for)",
            )
        tokens, hit_rate = 0, None
        if has_tokens:
            tokens = as_int(prefix["tokens"], f"{path}.tokens", minimum=0)
        else:
            hit_rate = as_float(prefix["hit_rate"], f"{path}.hit_rate", minimum=0.0)
            if hit_rate >= 1.0:
                raise ScenarioError(
                    f"{path}.hit_rate", hit_rate, "must be below 1 (every first request misses)"
                )
        groups = as_int(prefix.get("groups", 1), f"{path}.groups", minimum=1, maximum=10_000_000)
        return cls(
            tokens, groups, _popularity(prefix.get("popularity"), f"{path}.popularity"), hit_rate
        )


def _popularity(value: Any, path: str) -> float | None:
    """None for uniform, the Zipf exponent otherwise."""
    if value is None or value == "uniform":
        return None
    if isinstance(value, Mapping):
        check_keys(value, ("zipf",), path)
        if "zipf" in value:
            return as_float(value["zipf"], f"{path}.zipf", minimum=0.0, maximum=10.0)
    raise ScenarioError(path, value, "expected uniform or {zipf: s} with an exponent s >= 0")
