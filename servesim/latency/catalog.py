"""Which latency models each bundled model can use, and where coefficients exist for it.

``servesim list models`` prints this catalogue. For each model of ``models.yaml``:

* ``blackbox``: the (GPU, TP) pairs with fitted coefficients in ``blackbox_coefficients.yaml``;
* ``roofline`` and ``trained-physics``: any GPU of the hardware table, at the tensor-parallel
  sizes the model's heads allow (the check each model runs when it is built); they need the
  model's architecture config, bundled or found in the local HF cache;
* ``distserve-profile``: the GPU and TPs of a bundled profile fitted for this architecture.

The wrappers (``interference``, ``overheads``) run over any of these and are not listed per model.
"""

from __future__ import annotations

import contextlib
import textwrap
from typing import Any

import attrs

from servesim.latency.hardware import bundled_gpus
from servesim.latency.modelindex import ModelInfo, _model_index, bundled_models, resolve_model
from servesim.latency.modelspec import ModelSpec
from servesim.latency.tensor_parallel import check_tensor_parallel
from servesim.simcore.errors import ScenarioError

WIDTH = 100
"""Width the catalogue's prose lines wrap at (the tables are as wide as their cells)."""

TP_CANDIDATES = (1, 2, 4, 8, 16)
"""Tensor-parallel sizes the catalogue tries (others may be valid too)."""


@attrs.frozen
class CatalogEntry:
    """One model's row: its config and the latency models it can use."""

    name: str
    hf_id: str | None
    hf_repo: str | None
    aliases: tuple[str, ...]
    config: str | None
    """Where its architecture config is (None: blackbox coefficients only)."""
    origin: str
    blackbox: tuple[tuple[str, tuple[int, ...]], ...]
    """(GPU, TPs) with blackbox coefficients."""
    roofline_tp: tuple[int, ...]
    trained_physics_tp: tuple[int, ...]
    distserve_profile: tuple[tuple[str, str, tuple[int, ...]], ...]
    """(profile, GPU, TPs) of bundled DistServe profiles fitted for this architecture."""
    unmodelled: tuple[str, ...]
    """Classes of config fields servesim does not model (see ``hfconfig.unmodelled_fields``)."""
    problem: str = ""
    """Why a config found for the model could not be used (empty when none)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hf_id": self.hf_id,
            "hf_repo": self.hf_repo,
            "aliases": list(self.aliases),
            "config": self.config,
            "config_origin": self.origin or None,
            "latency_models": {
                "blackbox": {gpu: list(tps) for gpu, tps in self.blackbox},
                "roofline": None
                if self.config is None
                else {"gpus": "any", "tp": list(self.roofline_tp)},
                "trained-physics": None
                if self.config is None
                else {"gpus": "any", "tp": list(self.trained_physics_tp)},
                "distserve-profile": {
                    profile: {"gpu": gpu, "tp": list(tps)}
                    for profile, gpu, tps in self.distserve_profile
                },
            },
            "unmodelled": list(self.unmodelled),
            "problem": self.problem or None,
        }


def blackbox_pairs() -> dict[str, dict[str, tuple[int, ...]]]:
    """Lowercase model id → GPU → sorted TPs with blackbox coefficients."""
    from servesim.latency.blackbox import coefficient_table

    out: dict[str, dict[str, set[int]]] = {}
    for e in coefficient_table()[1]:
        out.setdefault(e.model.lower(), {}).setdefault(e.gpu, set()).add(e.tp)
    return {
        model: {gpu: tuple(sorted(tps)) for gpu, tps in sorted(gpus.items())}
        for model, gpus in out.items()
    }


def valid_tps(spec: ModelSpec, *, kv_heads_divisible: bool) -> tuple[int, ...]:
    """The TP candidates :func:`check_tensor_parallel` accepts for ``spec``."""
    ok = []
    for tp in TP_CANDIDATES:
        with contextlib.suppress(ScenarioError):
            check_tensor_parallel(spec, tp, kv_heads_divisible=kv_heads_divisible)
            ok.append(tp)
    return tuple(ok)


def _profiles_for(
    spec: ModelSpec | None, info: ModelInfo
) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    from servesim.latency.profiled import BUNDLED_PROFILES, load_profile

    found = []
    for name in BUNDLED_PROFILES:
        profile = load_profile(name)
        arch = profile.architecture
        if spec is not None and arch and all(hasattr(spec, k) for k in arch):
            matches = all(getattr(spec, k) == v for k, v in arch.items())
        else:
            matches = (info.hf_id or "").lower() == profile.model.lower()
        if matches:
            tps = sorted({tp for fits in profile.engines.values() for tp in fits})
            found.append((name, profile.gpu, tuple(tps)))
    return tuple(found)


def model_catalog() -> list[CatalogEntry]:
    """One entry per bundled model, in name order."""
    pairs = blackbox_pairs()
    entries = []
    for name in bundled_models():
        problem = ""
        try:
            info = resolve_model(name)
        except ScenarioError as exc:  # a config in the HF cache servesim cannot read
            entry = _model_index()[0][name]
            info = ModelInfo(name=name, hf_id=entry.hf_id, hf_repo=entry.hf_repo)
            problem = f"HF-cache config unusable: {exc.fix}"
        spec = info.spec
        trained_ok = spec is not None and spec.intermediate_size > 0
        entries.append(
            CatalogEntry(
                name=info.name,
                hf_id=info.hf_id,
                hf_repo=info.hf_repo,
                aliases=info.aliases,
                config=info.config_path,
                origin=info.origin,
                blackbox=tuple(pairs.get((info.hf_id or "").lower(), {}).items()),
                roofline_tp=() if spec is None else valid_tps(spec, kv_heads_divisible=False),
                trained_physics_tp=valid_tps(spec, kv_heads_divisible=True) if trained_ok else (),
                distserve_profile=_profiles_for(spec, info),
                unmodelled=tuple(u.kind for u in info.unmodelled),
                problem=problem,
            )
        )
    return entries


def _tps(tps: tuple[int, ...]) -> str:
    return ",".join(map(str, tps)) if tps else "none"


def _blackbox_cell(entry: CatalogEntry) -> str:
    return "; ".join(f"{gpu} {_tps(tps)}" for gpu, tps in entry.blackbox) or "-"


def _physics_cell(entry: CatalogEntry) -> str:
    if entry.config is None:
        return "needs config"
    if entry.roofline_tp == entry.trained_physics_tp:
        return _tps(entry.roofline_tp)
    return f"{_tps(entry.roofline_tp)} (trained-physics {_tps(entry.trained_physics_tp)})"


def _notes_cell(entry: CatalogEntry) -> str:
    notes = [f"distserve-profile: {gpu} tp {_tps(tps)}" for _, gpu, tps in entry.distserve_profile]
    if entry.origin.startswith("HF cache"):
        notes.append("config from the HF cache")
    if entry.unmodelled:
        notes.append("not modelled: " + ", ".join(entry.unmodelled))
    return "; ".join(notes)


def format_model_catalog(entries: list[CatalogEntry]) -> str:
    """The catalogue as two plain-text tables: models with an architecture config, then the
    blackbox coefficient ids without one."""
    gpus = ", ".join(bundled_gpus())
    with_config = [e for e in entries if e.config is not None]
    without = [e for e in entries if e.config is None]
    header = ("model", "roofline / trained-physics tp", "blackbox coefficients (gpu tp)", "notes")
    rows = [header] + [
        (e.name, _physics_cell(e), _blackbox_cell(e), _notes_cell(e)) for e in with_config
    ]
    lines = [
        *textwrap.wrap(
            f"Models with an architecture config ({len(with_config)}): every latency model; "
            f"roofline and trained-physics on any GPU ({gpus}) at the tp shown",
            WIDTH,
        ),
        *_table(rows),
        "",
        *textwrap.wrap(
            f"Blackbox coefficient ids without a bundled architecture ({len(without)}): blackbox "
            "only, at the gpu and tp shown. To use another latency model or size the KV cache "
            "automatically, give model: path/to/config.json or put the repository in the local "
            "HF cache (huggingface-cli download ORG/NAME config.json)",
            WIDTH,
        ),
    ]
    header2 = ("model", "huggingface id", "blackbox coefficients (gpu tp)", "notes")
    rows2 = [header2] + [
        (e.name, e.hf_repo or e.hf_id or "-", _blackbox_cell(e), e.problem) for e in without
    ]
    lines += _table(rows2)
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
