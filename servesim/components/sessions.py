"""Session rounds: how a multi-turn session opens, what its next round is and when it is sent.

Two kinds of sessions share the cluster's closed loop (:meth:`Lifecycle._end_of_round` and
:meth:`Lifecycle._next_round`): generated ones (``workload.sessions``: every round drawn, the same
number of rounds and think time for all) and recorded ones (a trace replayed with
``session_mode: closed-loop``, :class:`~servesim.workloads.base.RecordedSessions`: each session's
rounds, think times and turns as the trace has them). A part of
:class:`~servesim.components.cluster.Cluster` (a mixin over the cluster's state).
"""

from __future__ import annotations

from servesim.components.request import Request
from servesim.workloads.base import RecordedSessions, RequestSpec

Segments = tuple[tuple[int, int], ...] | None


class SessionRounds:
    def _open_session(self, req: Request, spec: RequestSpec) -> None:
        """A request from the workload's stream opens a session (generated: every one, its id
        the session's; recorded: the first round of the session the spec names, if any)."""
        sessions = self.sessions
        if isinstance(sessions, RecordedSessions):
            sid = spec.session
            if sid < 0:
                return  # a request outside any recorded conversation
            req.continues = sessions.continues(sid, 0) or spec.continued
        else:
            sid = req.id
            req.continues = sessions.rounds > 1
        req.session_id = sid
        self.session_state[sid] = "active"

    def _think_before_next(self, req: Request) -> int | None:
        """The think time before the round after ``req`` (which completed), or None after
        closing the session: its last round is done, or closed-loop users ran out of budget."""
        sid = req.session_id
        sessions = self.sessions
        following = req.round_index + 1
        if isinstance(sessions, RecordedSessions):
            if following >= sessions.rounds[sid]:
                self.session_state[sid] = "completed"
                return None
            return sessions.think_us(sid, following)
        budget = self.scenario.workload.num_requests
        if following >= sessions.rounds:
            self.session_state[sid] = "completed"
        elif (
            sessions.users and budget is not None and self._next_id + self._pending_rounds >= budget
        ):
            self.session_state[sid] = "exhausted"  # closed-loop users: the request budget is spent
        else:
            return sessions.think_time_us
        return None

    def _generated_round(self, prev: Request, arrival: int, rid: int) -> tuple[Request, Segments]:
        """The next round of a generated session: a new user turn on top of the conversation so
        far (``context: accumulate``), after the shared prefix only, or alone. Returned with its
        explicit content (for the exported workload)."""
        workload = self.scenario.workload
        new_input, output = next(self._follow_ups)
        if self.sessions.accumulate:
            context = prev.segments + ((2 * prev.id + 1, prev.num_generated),)
        elif prev.prefix_tokens:
            context = prev.segments[:1]
        else:
            context = ()
        shared = sum(length for _, length in context)
        segments = context + ((2 * rid, new_input),)  # the context is shareable: not its own
        budget = output if workload.max_output_tokens == "oracle" else workload.max_output_tokens
        req = Request(
            rid,
            arrival,
            shared + new_input,
            output,
            budget,
            prev.prefix_group,
            prev.prefix_tokens,
            prev.slo_class,
            prev.client,
            self._block_size,
            self.content_ids,
            prev.tenant,
            prev.priority,
            segments,
        )
        req.think_us = self.sessions.think_time_us
        req.continues = prev.round_index + 2 < self.sessions.rounds
        return req, segments

    def _recorded_round(self, prev: Request, arrival: int, rid: int) -> tuple[Request, Segments]:
        """The next round of a recorded session, as the trace has it. A round whose prompt holds
        the conversation so far is sent as the simulated conversation -- the previous prompt and
        the answer actually generated -- plus its recorded new turn, so its leading blocks can be
        prefix-cache hits; any other round with its recorded prompt (or content segments)."""
        sessions = self.sessions
        sid, index = prev.session_id, prev.round_index + 1
        spec = sessions.spec(sid, index)
        turn = sessions.new_turn(sid, index)
        group, prefix, segments = spec.prefix_group, spec.prefix_tokens, spec.segments
        prompt = spec.prompt_tokens
        if segments is None and turn > 0:
            context = prev.segments + ((2 * prev.id + 1, prev.num_generated),)
            segments = context + ((2 * rid, turn),)
            prompt = sum(length for _, length in context) + turn
            group, prefix = prev.prefix_group, prev.prefix_tokens
        req = Request(
            rid,
            arrival,
            prompt,
            spec.output_tokens,
            spec.max_output_tokens,
            group,
            prefix,
            spec.slo_class,
            spec.client,
            self._block_size,
            self.content_ids,
            spec.tenant,
            self.slo_priorities.get(spec.slo_class, 3),
            segments,
        )
        req.think_us = sessions.think_us(sid, index)
        req.continues = sessions.continues(sid, index) or spec.continued
        return req, segments
