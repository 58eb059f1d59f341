"""Expert parallelism across data-parallel ranks: the trained-physics step of one rank of a
lock-stepped MoE group, and the group's step.

vLLM's data-parallel ranks of a mixture-of-experts model each run their own batch through the
attention layers, but share the MoE layers: every GPU of the ``dp × tp`` group holds
``E / (dp·tp)`` of the routed experts, computes the tokens all ranks route to them, and the
tokens travel to their experts and back over the interconnect (dispatch and combine). The
ranks step together; a rank without work runs a dummy batch so that the others' collectives
complete.

How the tokens travel is vLLM's ``--all2all-backend`` (``latency.moe_comm_backend``). Its
default, ``allgather_reducescatter`` (vLLM 0.12 on; what a run that does not name one used), sends
every rank's hidden states to every GPU (all-gather) and brings the partial sums back
(reduce-scatter): one copy of each token, and on a ring each GPU's link carries the ``G − 1``
other ranks' chunks. The all-to-all backends (``pplx``, ``deepep_*``, ...) send each token's
``k`` routed copies, the ``(G − 1)/G`` of them bound for other GPUs.

One rank's step (BLIS's trained-physics terms, ``G = dp·tp``, ``T_r`` this rank's tokens,
``T_u`` the group's)::

    own terms       attention, projections, dense and shared-expert FFN of T_r on tp GPUs
    routed FFN      nMoE·(T_u·kEff/G)·2m·d·dffMoE / F      (weighted β1a / β2a by phase)
    weights         non-expert weights / tp + nMoE·(E/G)·m·d·dffMoE (β3)
    T_tp            all-reduces of the attention and dense layers on T_r (β4; no MoE all-reduce)
    T_dispatch      nMoE·T_r·(G−1)/G·2·d·bpp / BWref, × kEff for all-to-all (βEP)
    T_link          the physical excess of the fabric over H100 NVLink for both (µs): per MoE
                    layer two collectives of 2·nMoE·T_r·d·bpp·(G−1) bytes through each link
                    (all-gather/reduce-scatter) or 2·nMoE·T_r·kEff·d·bpp·(G−1)/G (all-to-all),
                    on the inter-node link when the group spans nodes

and the group step is the slowest rank's. With every rank carrying ``T/dp`` tokens this is
BLIS's own ``dp`` formula (``latency.dp``), which prices one instance whose batch is spread
evenly; here each rank has its own batch, so an unbalanced group waits for its busiest rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servesim.latency.base import BatchSummary
from servesim.latency.interconnect import Interconnect
from servesim.latency.parallel import Parallelism
from servesim.latency.trained import TrainedPhysicsLatencyModel
from servesim.simcore.errors import ScenarioError

IDLE_BATCH = BatchSummary(0, (), 1, 0)
"""What a rank without work computes in a group step: vLLM's dummy batch of one token."""


class ExpertParallelRank(TrainedPhysicsLatencyModel):
    """One data-parallel rank of a lock-stepped MoE group (built by :func:`expert_parallel_rank`)."""

    def configure(self, par: Parallelism) -> None:
        """Split the routed experts over the group and reprice its communication."""
        spec = self.spec
        group = par.expert_shards(spec, self.tp)
        self.par = par
        self.group_gpus = group
        self.expert_parallel = par.ep > 1
        self._set_expert_group(group, self.routing.skew if self.routing is not None else 0.0)
        link = self.interconnect
        if link is not None and par.expert_group_spans_nodes(self.tp):
            link = Interconnect(
                kind="network",
                gbs=par.internode_gbs,
                latency_us=par.internode_latency_us,
                generation="inter-node",
            )
        self.dispatch_link = link
        floor = 0.0
        per_token = 0.0
        if self.interconnect is not None:
            token_bytes = self._d * self._abpp
            if self.tp > 1:
                collectives = self._L + self._n_dense
                per_token += (
                    collectives * token_bytes * self.interconnect.excess_us_per_byte(self.tp)
                )
                floor += collectives * self.interconnect.excess_floor_us(self.tp)
            if group > 1 and link is not None:
                per_token += (
                    2.0 * self._n_moe * token_bytes
                    * link.dispatch_excess_us_per_byte(group, self._k_eff if self._all2all else 0.0)
                )  # fmt: skip
                op = "all_to_all" if self._all2all else "all_gather"
                floor += 2.0 * self._n_moe * link.excess_floor_us(group, op)
        self._comm_excess_per_token = per_token
        self.comm_floor_us = floor

    last_batch: BatchSummary = IDLE_BATCH
    last_step_us = 1

    def step_time_us(self, batch: BatchSummary) -> int:
        """This rank's own step, remembered (with its batch) for the group step."""
        self.last_batch = batch
        self.last_step_us = step = TrainedPhysicsLatencyModel.step_time_us(self, batch)
        return step

    def _comm(self, tokens: float) -> tuple[float, float]:
        """(T_tp, T_dispatch) for this rank's ``tokens``: no all-reduce after the MoE layers
        (their combine replaces it), dispatch and combine over the expert group."""
        t_tp = 0.0
        if self.tp > 1:
            t_tp = self._all_reduce(self._L, tokens) + self._all_reduce(self._n_dense, tokens)
        group = self._group
        routed = self._k_eff if self._all2all else 1.0
        t_dispatch = (
            self._n_moe * tokens * routed * (group - 1) / group * 2 * self._d * self._abpp
            / self._comm_bw
        )  # fmt: skip
        return t_tp, t_dispatch

    def _routed_us(self, tokens: float) -> float:
        """Routed-expert compute of ``tokens`` group tokens on one GPU, before its β (µs)."""
        return (
            self._n_moe * (tokens * self._k_eff * self._routed_share) * self._mlp_f * self._d
            * self._dff_moe / self._F
        )  # fmt: skip

    def group_step_us(self, batches: Sequence[BatchSummary | None]) -> int:
        """The lock-stepped group's step: each rank's own step plus the routed-expert work of
        the other ranks' tokens; the slowest rank sets it. ``None`` = an idle rank (dummy)."""
        ranks = [IDLE_BATCH if b is None or b.batch_size == 0 else b for b in batches]
        pf_all = float(sum(b.prefill_tokens for b in ranks))
        dc_all = float(sum(b.decode_requests for b in ranks))
        b = self._b
        prefill = max(b[0], self.prefill_floor)  # the prefill floor of _prefill_term (β9 = 0)
        slowest = 1
        for batch in ranks:
            own = self._step_us(batch, pf_all + dc_all)  # reads the experts the group touches
            others = prefill * self._routed_us(pf_all - batch.prefill_tokens) + b[
                1
            ] * self._routed_us(dc_all - batch.decode_requests)
            step = own + int(others)
            if step > slowest:
                slowest = step
        return slowest

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        link = self.dispatch_link
        out["expert_parallel"] = {
            **self.par.describe(),
            "expert_group_gpus": self.group_gpus,
            "experts_per_gpu": self.spec.num_experts / self.group_gpus,
            "dispatch": "all-to-all (top-k copies)"
            if self._all2all
            else "all-gather/reduce-scatter",
            "dispatch_link": None if link is None else link.describe(),
        }
        return out


def expert_parallel_rank(
    params: Any, context: Any, path: str, latency_name: str
) -> ExpertParallelRank:
    """The rank model of ``context.parallel``'s lock-stepped group, from the scenario's latency
    section (only trained-physics has the expert-group terms)."""
    if latency_name != "trained-physics":
        raise ScenarioError(
            f"{path}.model",
            latency_name,
            "data-parallel ranks of a mixture-of-experts model share their experts and step in "
            "lock-step; servesim prices that with the trained-physics model's expert-group terms "
            "only: use latency: {model: trained-physics}, or engine.dp: 1",
        )
    if "dp" in (params or {}):
        raise ScenarioError(
            f"{path}.dp",
            params["dp"],
            "latency.dp prices one instance spread over dp ranks (BLIS); with engine.dp each rank "
            "is its own instance: remove latency.dp",
        )
    model = ExpertParallelRank.from_config(params, context.at(path))
    model.configure(context.parallel)
    return model


def instance_latency(name: str, params: Any, context: Any, path: str) -> Any:
    """The latency model of one instance (one data-parallel rank): the registered model
    ``name`` built from ``params``, as a lock-stepped expert-group rank when the engine's
    parallelism asks for one, and under its pipeline/context parallelism."""
    from servesim.latency.interconnect import interconnect_of, parse_overrides
    from servesim.latency.parallel import wrap
    from servesim.simcore import registry

    par = context.parallel
    spec = context.model_spec
    cls = registry.get("latency", name)
    if par is None or par.plain or getattr(cls, "wraps_base", False):
        # a wrapper (overheads) builds its base model through this function itself
        return cls.from_config(params, context.at(path))
    if par.lockstep(spec) or (par.ep > 1 and name == "trained-physics"):
        # (ep without dp: the experts split over the tp GPUs, dispatched all-to-all)
        model = expert_parallel_rank(params, context, path, name)
    else:
        model = cls.from_config(params, context.at(path))
    if par.pp == 1 and par.cp == 1:
        return model
    link = getattr(model, "interconnect", None)
    if link is None and context.hardware is not None:
        overrides = parse_overrides(params or {}, path) if isinstance(params, dict) else {}
        link = interconnect_of(
            context.hardware,
            gbs=overrides.get("gbs"),
            latency_us=overrides.get("latency_us"),
            kind=overrides.get("kind"),
            path=path,
        )
    return wrap(model, spec, context.tp, par, link)
