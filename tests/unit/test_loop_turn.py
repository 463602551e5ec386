"""The network thread's turn (consumer/server/loop.py): a drain of a socket full of messages
stops as soon as another thread queues a call, so a settled step's or a published snapshot's
leases are not granted behind a backlog; the messages left are read on the next turn."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import zmq

from common.files.net_stats import LoopTiming
from consumer.server.calls import Calls
from consumer.server.loop import Loop


def test_a_drain_stops_for_a_queued_call_and_leaves_the_rest_on_the_socket():
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    calls = Calls()
    state = SimpleNamespace(timing=LoopTiming(), internal_error=None)
    unused: dict[str, Any] = dict.fromkeys(("control", "intake", "books", "announce", "handshakes"))
    loop = Loop(state, calls=calls, rollouts=pull, **unused)  # type: ignore[arg-type]
    try:
        for i in range(10):
            push.send(b"%d" % i)
        got: list[bytes] = []
        assert pull.poll(10_000)

        def handle(frames: list[zmq.Frame]) -> None:
            got.append(frames[0].bytes)
            if len(got) == 3:  # the learner queues a call while the third message is handled
                calls.submit(lambda: None, stopped=False)

        loop._drain(pull, handle)
        assert got == [b"0", b"1", b"2"]
        assert calls.pending()
        calls.run(stopped=lambda: False)
        assert not calls.pending()
        while len(got) < 10:  # the rest wait on the socket for the next turn
            assert pull.poll(10_000)
            loop._drain(pull, handle)
        assert got == [b"%d" % i for i in range(10)]
    finally:
        calls.close()
        for sock in (pull, push):
            sock.close(linger=0)
        ctx.term()
