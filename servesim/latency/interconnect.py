"""The GPU-to-GPU interconnect of an instance and what its collectives cost.

A collective over ``n`` GPUs on a message of ``bytes`` takes ``latency·steps + f·bytes / bandwidth``
(the α-β model NCCL's own tuner uses): an all-reduce has ``f = 2(n−1)/n`` (reduce-scatter then
all-gather, each moving ``(n−1)/n`` of the message), an all-gather or reduce-scatter
``f = (n−1)/n`` of the gathered message (``n`` chunks: ``n−1`` chunks through each link), an
all-to-all ``f = (n−1)/n`` of what each GPU sends.
``steps`` is where fabrics differ: on a switched or fully connected fabric (NVLink with NVSwitch,
AMD Infinity Fabric) vLLM's custom all-reduce finishes a small message in one shot, whatever ``n``
(measured on H100: 4.2–4.7 µs at 2, 4 and 8 GPUs), while over PCIe NCCL runs a ring of
``2(n−1)`` steps (``n−1`` for an all-gather or all-to-all).

BLIS's trained-physics model divides the all-reduce volume by the HBM bandwidth and weights it with
β4, fitted on NVLink H100s. That basis is not a physical link time: on an H100 a 16 MiB all-reduce
over two GPUs measures 156 µs (aiconfigurator, vLLM 0.24) while β4·V gives 4 µs; decode-size
collectives are latency-bound (4–8 µs) and BLIS's per-layer overhead β5 absorbs them. Rescaling β4's
basis by the link bandwidth would therefore carry the fit's under-pricing to every other fabric (a
PCIe card would pay a tenth of what its link physically needs). servesim instead keeps BLIS's term
exactly as fitted, evaluated at the reference H100's HBM bandwidth (so an H100 prices as BLIS does and
an H200's comm does not get faster with its HBM), and adds, per collective, the *physical excess* of
this GPU's fabric over the reference H100 NVLink (450 GB/s per direction, 4.5 µs per small
all-reduce): ``max(0, latency·steps − 4.5 µs) + f·bytes·max(0, 1/link − 1/450 GB/s)``, in µs with no
coefficient (nominal peak bandwidths, so the excess is a lower bound). A faster fabric (B200) gets no
credit: nothing in the fit says how much of β4·V it would save.
"""

from __future__ import annotations

from typing import Any

import attrs

from servesim.latency.hardware import INTERCONNECT_KINDS, HardwareSpec
from servesim.simcore.config import as_float, as_str
from servesim.simcore.describe import describe_fields
from servesim.simcore.errors import ScenarioError

REFERENCE_LINK_GBS = 450.0
"""H100 SXM NVLink 4 bandwidth per GPU and direction (GB/s): the fabric BLIS's β4 was fitted on."""
REFERENCE_HBM_TBS = 3.35
"""H100 SXM HBM3 bandwidth (TB/s): the unit BLIS's communication basis is written in."""
REFERENCE_LATENCY_US = 4.5
"""H100 NVLink floor of one small all-reduce (µs; vLLM custom all-reduce, one step)."""

SWITCHED = frozenset({"nvlink", "infinity-fabric"})


@attrs.frozen
class Interconnect:
    """One instance's fabric: kind (``nvlink``/``infinity-fabric``/``pcie``), per-GPU
    per-direction bandwidth (GB/s) and per-step latency floor (µs)."""

    kind: str
    gbs: float
    latency_us: float
    generation: str = ""

    def steps(self, gpus: int, op: str = "all_reduce") -> int:
        """Latency-bound steps of one small collective over ``gpus`` GPUs."""
        if gpus <= 1:
            return 0
        if self.kind in SWITCHED:
            return 1
        return 2 * (gpus - 1) if op == "all_reduce" else gpus - 1

    def collective_us(self, bytes_per_gpu: float, gpus: int, op: str = "all_reduce") -> float:
        """Physical time of one collective (µs): ``latency·steps + f·bytes/bandwidth``."""
        if gpus <= 1:
            return 0.0
        share = float(gpus - 1) / float(gpus)
        factor = 2.0 * share if op == "all_reduce" else share
        return self.latency_us * self.steps(gpus, op) + factor * bytes_per_gpu / (self.gbs * 1e3)

    def excess_floor_us(self, gpus: int, op: str = "all_reduce") -> float:
        """Latency floor of one collective beyond the H100 NVLink reference's (≥ 0, µs)."""
        if gpus <= 1:
            return 0.0
        excess = self.latency_us * self.steps(gpus, op) - REFERENCE_LATENCY_US
        return excess if excess > 0.0 else 0.0

    def excess_us_per_byte(self, gpus: int, op: str = "all_reduce") -> float:
        """µs per byte of the collective's message one collective costs beyond the reference
        H100 NVLink's: ``f·max(0, 1/link − 1/450 GB/s)``. The message is the whole tensor of an
        all-reduce, the gathered (all ranks') tensor of an all-gather or reduce-scatter, and
        what each GPU sends in an all-to-all."""
        if gpus <= 1:
            return 0.0
        share = float(gpus - 1) / float(gpus)
        factor = 2.0 * share if op == "all_reduce" else share
        slower = 1.0 / (self.gbs * 1e3) - 1.0 / (REFERENCE_LINK_GBS * 1e3)
        return factor * slower if slower > 0.0 else 0.0

    def dispatch_excess_us_per_byte(self, group: int, routed_copies: float) -> float:
        """Excess (µs) of one MoE dispatch or combine over an expert group of ``group`` GPUs,
        per byte of a rank's own hidden states.

        All-to-all (``routed_copies`` = kEff): each token's k copies, (G−1)/G of them remote.
        All-gather/reduce-scatter (``routed_copies`` = 0, vLLM's default): the gathered tensor
        holds every rank's chunk, G times the rank's own, and a ring moves (G−1)/G of it through
        each link: G−1 chunks (over 2 GPUs the whole chunk crosses, not half of it)."""
        if routed_copies > 0:
            return routed_copies * self.excess_us_per_byte(group, "all_to_all")
        return group * self.excess_us_per_byte(group, "all_gather")

    def describe(self) -> dict[str, Any]:
        return describe_fields(
            self,
            (
                "kind",
                "generation",
                ("gbs_per_direction", "gbs"),
                ("latency_us_per_step", "latency_us"),
            ),
        )


def interconnect_of(
    hardware: HardwareSpec,
    *,
    gbs: float | None = None,
    latency_us: float | None = None,
    kind: str | None = None,
    path: str = "latency",
) -> Interconnect | None:
    """The GPU's interconnect with a scenario's overrides applied; None when neither the GPU nor
    the scenario says what it is (then the models keep BLIS's HBM-bandwidth basis)."""
    if not hardware.interconnect:
        if gbs is None and latency_us is None and kind is None:
            return None
        if gbs is None or latency_us is None:
            missing = "interconnect_gbs" if gbs is None else "interconnect_latency_us"
            raise ScenarioError(
                f"{path}.{missing}",
                None,
                f"GPU {hardware.name} declares no interconnect; give both interconnect_gbs "
                "(per GPU, per direction, GB/s) and interconnect_latency_us (per collective step)",
            )
        kind = kind or "pcie"
    elif kind is None:
        kind = hardware.interconnect
    return Interconnect(
        kind=kind,
        gbs=hardware.interconnect_gbs if gbs is None else gbs,
        latency_us=hardware.interconnect_latency_us if latency_us is None else latency_us,
        generation=hardware.interconnect_generation
        if gbs is None and kind == hardware.interconnect
        else "scenario override",
    )


OVERRIDE_KEYS = ("interconnect", "interconnect_gbs", "interconnect_latency_us")
"""Keys a ``latency:`` section may carry to override the GPU's interconnect."""


def parse_overrides(params: Any, path: str) -> dict[str, Any]:
    """``interconnect`` (kind), ``interconnect_gbs`` (> 0) and ``interconnect_latency_us`` (≥ 0)
    from a latency section, as keyword arguments ``kind``, ``gbs``, ``latency_us``."""
    out: dict[str, Any] = {}
    if "interconnect" in params:
        out["kind"] = as_str(
            params["interconnect"], f"{path}.interconnect", choices=list(INTERCONNECT_KINDS)
        )
    fixes = {
        "interconnect_gbs": (
            "gbs",
            0.0,
            "give the per-GPU, per-direction link bandwidth in GB/s, a number > 0 "
            "(e.g. 32 for PCIe 4.0 x16, 450 for H100 NVLink)",
        ),
        "interconnect_latency_us": (
            "latency_us",
            None,
            "give the latency floor of one collective step in µs, a number >= 0 "
            "(e.g. 4.5 for NVLink, 5 for PCIe)",
        ),
    }
    for key, (name, floor, fix) in fixes.items():
        if key not in params:
            continue
        raw = params[key]
        try:
            value = as_float(raw, f"{path}.{key}")
        except ScenarioError:
            raise ScenarioError(f"{path}.{key}", raw, fix) from None
        if (floor is not None and value <= floor) or value < 0:
            raise ScenarioError(f"{path}.{key}", raw, fix)
        out[name] = value
    return out
