"""Data-parallel ranks of a mixture-of-experts model, stepping in lock-step.

vLLM's data-parallel ranks each have their own scheduler, wait queue and KV cache (each is one
servesim instance, routed to like any other), but they share the MoE layers: every forward pass
ends in collectives over all ranks, so the ranks step together, and a rank without work runs a
dummy batch so that the others' collectives complete. :class:`LockStepGroup` is one SimPy
process that drives its ranks' engines: while any rank has work, every rank forms its batch at
the same instant (an idle rank an empty one, logged as a step that computes nothing), the group
step lasts as long as the slowest rank's (``group_step_us`` of the ranks' latency model, plus
the largest per-rank extra such as a swap copy), and every rank ends it at the same instant.
Ranks never fast-forward (a window of one rank would not see the others' batches).
"""

from __future__ import annotations

from simpy.events import Event

from servesim.components.instance import Instance, _step_mark
from servesim.simcore.env import StepEvent, fire_at_step_priority


class LockStepRank(Instance):
    """One data-parallel rank: an instance whose steps its :class:`LockStepGroup` drives."""

    def __init__(self, env, engine) -> None:
        self.group: LockStepGroup | None = None
        super().__init__(env, engine, exact_steps=True)

    def _run(self):
        """The group's process steps this rank; its own process ends at once."""
        return
        yield  # a generator, as SimPy wants

    def _wake(self) -> None:
        self.group.wake()


class LockStepGroup:
    """The process that steps a lock-stepped group of ranks together."""

    def __init__(self, env, ranks: list[LockStepRank]) -> None:
        self.env = env
        self.ranks = ranks
        for rank in ranks:
            rank.group = self
        self.priority = ranks[0].priority
        self.form_priority = ranks[0].form_priority
        self.steps = 0
        self._idle: Event | None = None
        self._mark = _step_mark(env)
        self.process = env.process(self._run())

    def wake(self) -> None:
        """A request reached a rank: an idle group forms its next step in this instant."""
        if self._idle is not None:
            idle, self._idle = self._idle, None
            fire_at_step_priority(self.env, idle, self.form_priority)

    def _run(self):
        env = self.env
        engines = [rank.engine for rank in self.ranks]
        pricing = engines[0].latency
        priority = self.priority
        mark = self._mark
        while True:
            if not any(engine.has_work() for engine in engines):
                self._idle = Event(env)
                yield self._idle
                mark.passed(env.now, priority)
                continue
            now = env.now
            batches = []
            extra = 0
            for engine in engines:
                dt = engine.form_batch(now)
                latency = engine.latency
                batches.append(latency.last_batch)
                owed = dt - latency.last_step_us  # swap copies, CPU-tier reloads of this rank
                if owed > extra:
                    extra = owed
            dt = pricing.group_step_us(batches) + extra
            yield StepEvent(env, dt, priority)
            end = now + dt
            mark.passed(end, priority)
            for engine in engines:
                engine.end_step(end)
            self.steps += 1
            if self.ranks[0].defer_forming and env.peek() == env.now:
                # something else happens at this boundary (a completion's consequences): form
                # the next step after it, as a single instance does
                yield StepEvent(env, 0, self.form_priority)


def lockstep_groups(env, instances: list, scenario) -> list[LockStepGroup]:
    """One :class:`LockStepGroup` per run of ``engine.dp`` consecutive lock-stepped ranks (the
    scenario expands each data-parallel engine into its ranks, in order)."""
    groups = []
    specs = scenario.instance_specs
    i = 0
    while i < len(instances):
        if not isinstance(instances[i], LockStepRank):
            i += 1
            continue
        dp = specs[i].engine.dp
        ranks = instances[i : i + dp]
        if not hasattr(ranks[0].engine.latency, "group_step_us"):
            from servesim.simcore.errors import ScenarioError

            raise ScenarioError(
                "latency.model",
                getattr(ranks[0].engine.latency, "name", "?"),
                "lock-stepped data-parallel MoE ranks need a latency model that prices the "
                "expert group (trained-physics, optionally wrapped in overheads)",
            )
        groups.append(LockStepGroup(env, ranks))
        i += dp
    return groups
