"""A disk that stalls: the network thread never waits on it, so heartbeats and lease requests
are answered while leases.jsonl's append hangs (consumer/server/book_writer.py)."""

from __future__ import annotations

import threading

import pytest
from served import one_group_admitted, request

from common import wire
from common.files import run_files as RF


@pytest.fixture
def stalled_appends(monkeypatch):
    """leases.jsonl's appends block until the test releases them; `entered` is set once one
    is blocked."""
    entered, release = threading.Event(), threading.Event()
    append = RF.append_leases

    def stalled(run_dir, lines):
        lines = list(lines)
        if lines:
            entered.set()
            assert release.wait(60), "the test never released the stalled write"
        append(run_dir, lines)

    monkeypatch.setattr(RF, "append_leases", stalled)
    yield entered, release
    release.set()


def test_heartbeats_and_lease_requests_are_answered_while_the_books_disk_stalls(
    tmp_path, stalled_appends
):
    entered, release = stalled_appends
    with one_group_admitted(tmp_path) as (srv, control, lease, got):
        srv.settle_trained([got], trained_step=0)  # its line for leases.jsonl: the write stalls
        assert entered.wait(10)
        for n in range(10):  # each answered while the write still hangs
            reply = request(control, wire.Heartbeat(10 + n, "p", 0, "idle", 0))
            assert isinstance(reply, wire.StatusReply)
        assert isinstance(request(control, wire.LeaseRequest(30, "p", 4, 0)), wire.LeaseGrant)
        assert not release.is_set()
        assert RF.read_leases(tmp_path) == []  # still stalled: nothing written yet
        release.set()
        srv.flush_ledger()
        assert [line.lease_id for line in RF.read_leases(tmp_path)] == [lease.lease_id]
