"""Disaggregation deciders: does a request's prefill run on the prefill pool, with its KV cache
then moved to the decode instance, or does the decode instance serve it end to end?

The cluster asks a decider after it has chosen the decode instance (decode-first, as llm-d does;
spec §5.2–5.3). A decider sees the request's prompt (never its output length, INV-9) and the
chosen decode instance's snapshot, whose ``cached_prefix_blocks`` answers prefix-cache queries with the
router's signal delay. Subclass :class:`Decider` and register it to add one::

    @register("disaggregation", "long-prompts")
    class LongPrompts(Decider):
        def disaggregate(self, request, decode):
            return request.prompt_tokens > 2048
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from servesim.policies.base import Policy
from servesim.policies.snapshot import InstanceSnapshot
from servesim.simcore.config import as_int, check_keys
from servesim.simcore.registry import PluginContext, register

__all__ = ["Decider", "Never", "Always", "PrefixThreshold", "DirectToDecode"]


class Decider(Policy):
    """Base class. ``reads_prefix_cache`` True makes the decode snapshots answer cache queries."""

    reads_prefix_cache = False

    @abstractmethod
    def disaggregate(self, request: Any, decode: InstanceSnapshot) -> bool:
        """True: prefill on the prefill pool and transfer the KV to ``decode``."""


@register("disaggregation", "never")
class Never(Decider):
    """Every request is served end to end by its decode-pool instance."""

    name = "never"

    def disaggregate(self, request: Any, decode: InstanceSnapshot) -> bool:
        return False


@register("disaggregation", "always")
class Always(Decider):
    """Every request's prefill runs on the prefill pool."""

    name = "always"

    def disaggregate(self, request: Any, decode: InstanceSnapshot) -> bool:
        return True


@register("disaggregation", "prefix-threshold")
class PrefixThreshold(Decider):
    """Split when the prompt's part the decode instance does not cache exceeds ``threshold``
    tokens: ``prompt − cached_blocks·block_size > threshold`` (spec §5.3; BLIS default 16).

    A warm prefix is cheap to prefill locally; a long cold prompt is worth moving off the decode
    instance. The cached part is what the router sees (``cluster.cache_signal_delay`` applies).
    """

    name = "prefix-threshold"
    reads_prefix_cache = True

    def __init__(self, threshold: int = 16):
        self.threshold = threshold

    def disaggregate(self, request: Any, decode: InstanceSnapshot) -> bool:
        prompt = request.prompt_tokens
        if prompt <= 0:
            return False
        cached = decode.cached_prefix_blocks(request.prompt_block_ids()) * request.block_size
        return prompt - cached > self.threshold

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> PrefixThreshold:
        check_keys(params, ["threshold"], ctx.path)
        return cls(as_int(params.get("threshold", 16), f"{ctx.path}.threshold", minimum=0))


@register("disaggregation", "direct-to-decode")
class DirectToDecode(Decider):
    """Short prompts go straight to decode: split only when ``prompt ≥ threshold`` tokens
    (BLIS's removed ``--pd-direct-decode-threshold``, default 256)."""

    name = "direct-to-decode"

    def __init__(self, threshold: int = 256):
        self.threshold = threshold

    def disaggregate(self, request: Any, decode: InstanceSnapshot) -> bool:
        return request.prompt_tokens >= self.threshold

    @classmethod
    def from_config(cls, params: Mapping[str, Any], ctx: PluginContext) -> DirectToDecode:
        check_keys(params, ["threshold"], ctx.path)
        return cls(as_int(params.get("threshold", 256), f"{ctx.path}.threshold", minimum=0))
