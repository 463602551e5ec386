"""Groups arriving on the rollouts socket, on the network thread: decoded, checked, admitted.

A group message is accepted only from a registered producer id (`not_registered`) with the key
that registered it (`wrong_key`, consumer/server/identity.py), for an open lease of that
producer: a group for another producer's lease is refused (`rejected.wrong_producer`), neither
trained nor credited, and the lease stays with its holder. An accepted group is offered to the
learner's bounded queue (consumer/server/admission.py, `net.max_queued_groups`,
`net.max_queued_mib`); a valid group that does not fit is not admitted: its lease is `held` and
its producer told to hold it, then to send it when the learner has made room (acks `hold` /
`send`). The rollouts socket is always read, so ZeroMQ's queues never grow with a slow learner.
An evaluation group (`Group.evaluation`) never reaches the learner's queue: it goes to the eval
rounds (consumer/evaluation/rounds.py), counted under `eval_groups_<verdict>`.

A group whose rewards are all equal (with `train.drop_zero_variance`) and that is within the
staleness bound when it arrives can never be trained: its lease ends as `dropped_zero_variance`
as soon as it is admitted, so its slot is granted again at once, while the learner is still busy
with its step (the learner used to end it only when it took the group from its queue, between
steps: on docs/real_model's task, where 60% of the groups are all right or all wrong, a
producer held 16 leases of which most waited for that, and stood idle half of every step). The
group still goes to the learner (its rewards count in the step's headline, it is recorded in
the stream, its drop is counted at that step); `settled_on_arrival` tells the learner it is done.

A bad message is counted under `rejected.<reason>` and never raises out of the loop; a group
that parsed but failed validation ends its lease as `rejected_invalid` and its producer is told
(an ack with that outcome).
"""

from __future__ import annotations

import logging
import time

import zmq

from common import wire
from common.errors import WireError
from consumer.server.state import NetState, peer_key
from consumer.staleness import zero_variance


class Intake:
    """The handler of one rollouts message (its frames), decoded with `limits`."""

    def __init__(self, state: NetState, limits: wire.Limits) -> None:
        self._state, self.limits = state, limits

    def on_frames(self, frames: list[zmq.Frame]) -> None:
        st = self._state
        st.count("messages")
        key = peer_key(frames[0])
        if len(frames) != 1:
            return self._reject(WireError("multipart", f"{len(frames)} frames"), key)
        try:
            msg = wire.decode(frames[0].buffer, self.limits)
        except WireError as exc:
            return self._reject(exc, key)
        if not isinstance(msg, wire.Group):
            return self._reject(WireError("unexpected_kind", type(msg).__name__), key)
        if msg.producer_id not in st.producers:
            return self._reject(WireError("not_registered", "register first"), key)
        if not st.identities.allows(msg.producer_id, key):
            return self._reject(WireError("wrong_key", "not this producer's key"), key)
        if msg.evaluation:
            return self._evaluation(msg, key)
        verdict = st.book.receive(msg.lease_id, msg.producer_id)
        if verdict == "wrong_producer":
            return self._reject(WireError("wrong_producer", "another producer's lease"), key)
        settle = verdict == "accept" and self._no_signal(msg)
        if settle:  # before the learner can take it from the queue
            st.settle_on_arrival(msg.lease_id)
        if verdict == "accept" and not st.admission.offer(
            msg, len(frames[0].buffer), now=time.monotonic()
        ):
            st.book.hold(msg.lease_id)  # no room: its producer keeps it until told to send
            verdict, settle = "not_admitted", False  # counted as groups_not_admitted
            st.unsettle(msg.lease_id)
        if settle:
            info = {"behavior_version": msg.behavior_version, "num_tokens": msg.num_tokens}
            st.book.finalize(msg.lease_id, "dropped_zero_variance", **info)
        st.count(f"groups_{verdict}")

    def _no_signal(self, msg: wire.Group) -> bool:
        """Equal rewards, and fresh enough that the learner would drop it for that, not as
        stale (a stale group's prompt is leased again)."""
        st = self._state
        behind = st.policy_version - msg.behavior_version
        fresh = 0 <= behind <= st.cfg.staleness.max_staleness
        return st.cfg.train.drop_zero_variance and fresh and zero_variance(msg.rewards)

    def _evaluation(self, msg: wire.Group, key: str) -> None:
        """An evaluation group: counted by its round, never trained."""
        st = self._state
        if st.evals is None:
            return self._reject(WireError("unexpected_kind", "evaluation is off"), key)
        verdict = st.evals.receive(msg)
        if verdict == "wrong_producer":
            return self._reject(WireError("wrong_producer", "another producer's lease"), key)
        st.count(f"eval_groups_{verdict}")

    def _reject(self, exc: WireError, key: str) -> None:
        """Count a refused group message; one that parsed but failed a check ends its lease
        as rejected_invalid, if it came from the lease's holder (id and key)."""
        st = self._state
        st.count(f"rejected.{exc.reason}")
        st.count("rejected")
        st.log.log(f"group.{exc.reason}", logging.WARNING, "rejected a group message: %s", exc)
        rec = st.book.open.get(exc.lease_id) if exc.lease_id is not None else None
        if (
            rec is not None
            and rec.state in ("issued", "held")
            and rec.producer_id == exc.producer_id
            and st.identities.allows(rec.producer_id, key)
            and exc.reason not in ("not_registered", "wrong_key", "wrong_producer")
        ):
            st.book.finalize(rec.lease_id, "rejected_invalid", reason=exc.reason)
