"""Energy per token for ``servesim plan``: the ``energy_per_million_tokens`` objective.

The bundled GPU table has no board power (TDP) yet, so the watts come from the plan: ``power:
{GPU: watts}`` or ``--power GPU=W``. A fleet's energy per million output tokens is then

    kWh / M tokens = GPUs × watts / (output tokens/s) × 10^6 / 3.6·10^6

at the offered load. It assumes every GPU draws the given power the whole time: with the boards'
TDP that is an upper bound (an idle or memory-bound GPU draws less), and it leaves out the host,
the network and cooling. It ranks fleets by how many GPU-watts each token costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servesim.simcore.config import as_float, expect_mapping
from servesim.simcore.errors import ScenarioError

ENERGY_OBJECTIVE = "energy_per_million_tokens"
MAX_WATTS = 10_000.0
"""No accelerator board draws more (a GB300 superchip is rated at a few kW)."""


def _match(key: Any, specs: Sequence[Any], where: str) -> str:
    """The searched GPU a ``power`` key names (its name or an alias, any case)."""
    text = str(key).strip().lower()
    for spec in specs:
        if text in (spec.name.lower(), *(a.lower() for a in spec.aliases)):
            return str(spec.name)
    names = ", ".join(s.name for s in specs)
    raise ScenarioError(where, key, f"not a searched GPU; power is given for these: {names}")


def parse_power(
    value: Any, options: Sequence[str], specs: Sequence[Any], objective: str
) -> dict[str, float]:
    """``{GPU name: watts}`` from the plan's ``power`` mapping, then ``--power GPU=W`` options.
    Ranking by energy needs a figure for every searched GPU."""
    out: dict[str, float] = {}
    if value is not None:
        for key, watts in expect_mapping(value, "power").items():
            where = f"power.{key}"
            out[_match(key, specs, where)] = as_float(
                watts, where, exclusive_minimum=0, maximum=MAX_WATTS
            )
    for option in options:
        key, sep, watts = option.partition("=")
        if not sep:
            raise ScenarioError("--power", option, "expected GPU=W, e.g. --power H100=700")
        where = f"--power {key.strip()}"
        out[_match(key, specs, where)] = as_float(
            watts.strip(), where, exclusive_minimum=0, maximum=MAX_WATTS
        )
    if objective == ENERGY_OBJECTIVE:
        for i, spec in enumerate(specs):
            if spec.name not in out:
                raise ScenarioError(
                    f"search.gpu[{i}]",
                    spec.name,
                    f"ranking by {ENERGY_OBJECTIVE} needs each GPU's power: give power: "
                    f"{{{spec.name}: W}} in the plan or --power {spec.name}=W (the board's TDP "
                    "from its datasheet: servesim's GPU table has none)",
                )
    return out


def energy_kwh_per_million(
    gpus: int | None, watts: float | None, tokens_per_sec: float | None
) -> float | None:
    """kWh per million output tokens (module docstring); None when a term is unknown."""
    if not gpus or not watts or not tokens_per_sec:
        return None
    return gpus * watts / tokens_per_sec * 1e6 / 3.6e6
