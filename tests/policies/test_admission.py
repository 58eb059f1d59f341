"""Admission policies (spec §4.1): always-admit, reject-all, the token bucket's arithmetic,
tier shedding under load, GAIE's legacy rule, and their parameter validation."""

from __future__ import annotations

import math

import pytest

from servesim.policies.admission import (
    AlwaysAdmit,
    GaieLegacy,
    RejectAll,
    TierShed,
    TokenBucket,
)
from servesim.policies.snapshot import ClusterState, InstanceSnapshot
from servesim.simcore import registry
from servesim.simcore.errors import ScenarioError
from servesim.simcore.registry import PluginContext
from servesim.testing import ProbeRequest

PATH = "policies.admission"


def state(now_us=0, loads=(0,), kv=None):
    kv = kv or [0.0] * len(loads)
    snaps = [
        InstanceSnapshot(i, queue_depth=q, kv_utilization=k)
        for i, (q, k) in enumerate(zip(loads, kv))
    ]
    return ClusterState(now_us, snaps)


def req(prompt_tokens=100, slo_class="standard", i=0):
    return ProbeRequest(i, prompt_tokens=prompt_tokens, slo_class=slo_class)


def test_always_admit_and_reject_all():
    assert AlwaysAdmit().admit(req(), state()) is True
    assert RejectAll().admit(req(), state()) is False


def test_the_builtins_are_registered():
    assert {"always-admit", "reject-all", "token-bucket", "tier-shed", "gaie-legacy"} <= set(
        registry.registry("admission").names()
    )


# ------------------------------------------------------------------ token bucket


def test_token_bucket_starts_full_and_charges_prompt_tokens():
    bucket = TokenBucket(capacity=100, refill_per_s=10)
    assert bucket.admit(req(60), state(0))
    assert bucket.tokens == 40
    assert not bucket.admit(req(50), state(0))  # a rejection costs nothing
    assert bucket.tokens == 40
    assert bucket.admit(req(40), state(0))
    assert bucket.tokens == 0


def test_token_bucket_refills_per_elapsed_microsecond_up_to_capacity():
    bucket = TokenBucket(capacity=100, refill_per_s=10)
    assert bucket.admit(req(100), state(0))
    assert not bucket.admit(req(5), state(400_000))  # 0.4 s · 10/s = 4 tokens
    assert bucket.tokens == pytest.approx(4.0)
    assert bucket.admit(req(5), state(500_000))  # +1 token -> 5
    assert bucket.tokens == pytest.approx(0.0)
    bucket.admit(req(0), state(3_600_000_000))  # an hour later: capped at capacity
    assert bucket.tokens == 100


def test_token_bucket_never_admits_a_prompt_larger_than_its_capacity():
    bucket = TokenBucket(capacity=10, refill_per_s=1e6)
    assert not bucket.admit(req(11), state(10**9))


def test_token_bucket_defaults_and_validation():
    bucket = TokenBucket.from_config({}, PluginContext(PATH))
    assert (bucket.capacity, bucket.refill_per_s, bucket.tokens) == (10_000, 1_000, 10_000)
    assert TokenBucket.from_config({"refill_per_s": 0}, PluginContext(PATH)).refill_per_s == 0
    for field, bad in (
        ("capacity", 0),
        ("capacity", -5),
        ("capacity", math.nan),
        ("refill_per_s", -1),
        ("refill_per_s", math.inf),
        ("refill_per_s", "fast"),
    ):
        with pytest.raises(ScenarioError) as info:
            TokenBucket.from_config({field: bad}, PluginContext(PATH))
        assert info.value.path == f"{PATH}.{field}"
    with pytest.raises(ScenarioError) as info:
        TokenBucket.from_config({"rate": 5}, PluginContext(PATH))
    assert info.value.path == f"{PATH}.rate"


# ------------------------------------------------------------------ tier shedding


def test_tier_shed_admits_everyone_while_the_busiest_load_is_within_the_threshold():
    shed = TierShed(threshold=3, min_priority=3)
    assert shed.admit(req(slo_class="background"), state(loads=(1, 3)))


def test_tier_shed_rejects_lower_tiers_once_the_busiest_load_exceeds_the_threshold():
    shed = TierShed.from_config({}, PluginContext(PATH))  # threshold 0, min priority 3 (standard)
    busy = state(loads=(0, 1))
    assert shed.admit(req(slo_class="critical"), busy)
    assert shed.admit(req(slo_class="standard"), busy)
    assert shed.admit(req(slo_class="unknown-class"), busy)  # unknown = standard
    for cls in ("batch", "sheddable", "background"):
        assert not shed.admit(req(slo_class=cls), busy)
    assert shed.admit(req(slo_class="background"), state(loads=(0, 0)))


def test_tier_shed_validation():
    shed = TierShed.from_config({"threshold": 10, "min_priority": -1}, PluginContext(PATH))
    assert (shed.threshold, shed.min_priority) == (10, -1)
    for field, bad in (
        ("threshold", -1),
        ("threshold", math.nan),
        ("min_priority", 1.5),
        ("min_priority", 101),
    ):
        with pytest.raises(ScenarioError) as info:
            TierShed.from_config({field: bad}, PluginContext(PATH))
        assert info.value.path == f"{PATH}.{field}"


# ------------------------------------------------------------------ gaie-legacy


def test_gaie_legacy_sheds_only_sheddable_requests_when_saturated():
    policy = GaieLegacy.from_config({}, PluginContext(PATH))
    # mean(max(5/5, 0), max(0, 0.8/0.8)) = 1 -> saturated
    saturated = state(loads=(5, 0), kv=[0.0, 0.8])
    calm = state(loads=(2, 0), kv=[0.0, 0.4])  # mean(0.4, 0.5) = 0.45
    assert policy.admit(req(slo_class="batch"), calm)
    assert not policy.admit(req(slo_class="batch"), saturated)
    assert policy.admit(req(slo_class="standard"), saturated)
    assert not policy.admit(req(slo_class="sheddable"), ClusterState(0, []))  # no instance = full
