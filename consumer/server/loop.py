"""The network thread itself ("consumer-net"): one poller over the control and rollouts sockets
and the calls' wake-up, each event dispatched to its handler, then the housekeeping.

Each turn: run the calls other threads queued (consumer/server/calls.py) and serve the parked
lease requests (consumer/server/parked.py), first, so the leases a settled step or a published
snapshot frees are granted before any socket is read; drain the rollouts socket
(consumer/server/intake.py) and the control socket (consumer/server/control.py), up to `_DRAIN`
messages each, stopping early once a call is queued; run the calls and serve the parked
requests again; push the groups the learner made room for (`Admission.release`); and every
0.25 s the housekeeping:
producers silent for `net.producer_timeout_s`, or three heartbeat periods when the
consumer has lengthened the period beyond a third of it (`NetState.producer_timeout_s`,
common/net/heartbeat.py), are gone (their leases expire), leases past
`net.lease_timeout_s` expire, records of producers that left or went silent, holding no lease,
are forgotten after `_FORGET_AFTER_S` (with their acks), held groups whose lease ended otherwise
are pruned, and the books are handed to their writer thread when due (consumer/server/books.py).
None of it scans every producer or every open lease: silence and ending come from
consumer/server/liveness.py, lease expiry from the lease book's heap.

A message whose handling raises is counted and dropped (`NetState.internal_error`): one message
never ends this thread. Anything else that raises here ends it: the error is kept (`error`, which
`Server.check` re-raises on the training thread), queued calls fail, and the sockets close.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable

import zmq

from common.files.disk import disk_fault
from consumer.server.books import Books
from consumer.server.calls import Calls
from consumer.server.control import Control
from consumer.server.handshakes import Handshakes
from consumer.server.intake import Intake
from consumer.server.state import NetState

log = logging.getLogger("asyncgrpo.consumer")
_FORGET_AFTER_S = 600.0  # a producer record that left or went silent, holding no lease
_DRAIN = 256  # messages read from one socket per turn
SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval in a process that serves (see _run)


class Loop:
    """The network thread: `start`, `stop`; `error` says why it died, if it did. It closes
    `rollouts`, `announce` and the control socket when it ends."""

    def __init__(
        self,
        state: NetState,
        *,
        control: Control,
        intake: Intake,
        books: Books,
        calls: Calls,
        rollouts: zmq.Socket[bytes],
        announce: zmq.Socket[bytes],
        handshakes: Handshakes,
    ) -> None:
        self._state, self._control, self._intake = state, control, intake
        self._books, self._calls = books, calls
        self._rollouts, self._announce = rollouts, announce
        self._handshakes = handshakes
        self.error: BaseException | None = None  # why the network thread died, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="consumer-net", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it; a thread never started closes its sockets here."""
        self._stop.set()
        if self._thread.ident is None:  # never started: no `_run` to close them
            self._close()
            return
        self._thread.join()

    def stopped(self) -> bool:
        """The thread failed, or ran and ended: calls would never be run."""
        return self.error is not None or (
            self._thread.ident is not None and not self._thread.is_alive()
        )

    def fail(self, exc: BaseException) -> None:
        """Stop the thread as if it had failed with `exc` (a call nobody waited for failed)."""
        self.error = exc
        self._stop.set()

    def _failed(self) -> bool:
        return self.error is not None

    def _run(self) -> None:
        control = self._control.sock
        poller = zmq.Poller()
        poller.register(control, zmq.POLLIN)
        poller.register(self._rollouts, zmq.POLLIN)
        monitor = self._handshakes.monitor
        poller.register(monitor, zmq.POLLIN)
        wake_fd = self._calls.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        next_housekeeping = 0.0
        # what the process built before serving (imports, torch, the model) is never scanned
        # by the cyclic collector again: a full collection costs what was made since, not
        # hundreds of milliseconds on this thread (garbage is collected first, not frozen)
        gc.collect()
        gc.freeze()
        # the GIL changes hands every 0.5 ms, not CPython's 5: with the learner's, publisher's,
        # recorder's and books' threads in this process, this thread waited up to 85-93 ms
        # for it between two socket reads at 1,024 producers, 19-23 ms with this (bench/swarm.py)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            timing = self._state.timing  # the stretches in which no socket is read
            while not self._stop.is_set():
                events = dict(poller.poll(timeout=10))
                timing.resume()
                if wake_fd in events:
                    self._calls.take_wake_ups()
                self._run_calls()  # first: the leases a settled step frees go out at once
                if self._rollouts in events:
                    self._drain(self._rollouts, self._intake.on_frames)
                if control in events:
                    self._drain(control, self._control.on_frames)
                if monitor in events:
                    self._handshakes.on_events()
                self._run_calls()  # those queued meanwhile (a drain stops for them)
                now = time.monotonic()
                self._control.release(self._state.admission.release())  # the learner made room
                if now >= next_housekeeping:
                    self._housekeeping(now)
                    next_housekeeping = now + 0.25
                timing.served()
            self._calls.run(stopped=self._failed)
            self._books.flush()  # written before `_close` ends the writer
        except BaseException as exc:
            self.error = exc
            self._calls.fail_all()
            if disk_fault(exc) is not None:  # the consumer's top says it, in one line
                return
            log.exception("network thread failed")
            raise
        finally:
            self._close()

    def _close(self) -> None:
        self._handshakes.close()
        for sock in (self._control.sock, self._rollouts, self._announce):
            sock.close(linger=0)
        self._calls.close()
        self._books.close()

    def _run_calls(self) -> None:
        """Run the queued calls, then serve the parked lease requests (a call that settled a
        step or published a snapshot freed leases for them)."""
        self._calls.run(stopped=self._failed)
        if self._control.parked:
            self._control.parked.serve(time.monotonic())

    def _drain(self, sock: zmq.Socket[bytes], handler: Callable[[list[zmq.Frame]], None]) -> None:
        """Handle up to `_DRAIN` messages from `sock`; stop early when a call is queued (the
        learner waits for it, and the producers for the leases it may free)."""
        for _ in range(_DRAIN):
            if self._calls.pending():
                return
            self._state.timing.served()
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                handler(frames)
            except Exception as exc:  # one message must never end this thread
                self._state.internal_error(exc)

    def _housekeeping(self, now: float) -> None:
        """Silent producers go, overdue leases expire, long-ended producers are forgotten, the
        books are handed over when due: each costs what it finds, not the number of producers."""
        st, net = self._state, self._state.cfg.net
        timeout_s = st.producer_timeout_s()
        gone = st.liveness.silent(now, timeout_s)
        expired = st.book.expire(now=now, lease_timeout_s=net.lease_timeout_s, gone=set(gone))
        with st.lock:
            for p in gone:
                log.warning(
                    "producer %s silent for %.0f s: gone, its leases expire",
                    p,
                    timeout_s,
                )
                view = st.producers[p]
                view.state, view.last_seen, view.ended_at = "gone", float("inf"), now
                st.liveness.ended(p, now)
                st.note(p)
                self._control.parked.drop(p)  # gone: nobody to answer
        st.count("expired", len(expired))
        self._forget(now, max(_FORGET_AFTER_S, 10 * timeout_s))
        if expired:
            self._books.append_finished()
        st.admission.prune(st.book.open)  # held groups whose lease ended otherwise
        if st.evals is not None and st.evals.rounds:
            st.evals.expire(now=now, lease_timeout_s=net.lease_timeout_s, gone=set(gone))
            if st.snapshot is not None:
                live = {
                    v.loaded_version
                    for v in st.producers.values()
                    if v.state not in ("gone", "left")
                }
                st.evals.close_unreachable(live, st.snapshot.version)  # costs rounds x producers
        self._books.maybe_write(now)

    def _forget(self, now: float, after_s: float) -> None:
        """Forget the records of producers that left or went silent more than `after_s` ago
        and hold no lease (one that spoke again since is no longer ended)."""
        st = self._state
        forget = []
        for p in st.liveness.due(now, after_s):
            view = st.producers.get(p)
            if view is None or view.state not in ("gone", "left"):
                st.liveness.revive(p)
            elif not st.book.holds(p):
                forget.append(p)
        st.forget(forget)
        for p in forget:
            st.liveness.forget(p)
            st.book.forget_acks(p)
            st.identities.forget(p)
            self._control.forget(p)  # its parked request, fetch records and relay
