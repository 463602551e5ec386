"""A step's bookkeeping does not grow with the number of producers (consumer/server/server.py with
consumer/server/roster.py): real sockets on loopback, scripted producers.

- what the learner reads per step (`Server.step_summary`) has the same keys and size at 1 and
  at 200 producers; each producer's view goes to producers.json / producers.jsonl instead, a
  history line only when its version or state changed;
- a settled step appends its leases to leases.jsonl and does not rewrite ledger.json (that is
  housekeeping's, at most every few seconds, or a forced flush's).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading

import numpy as np
import pytest
import zmq
from served import started_server

from common import config as C
from common import wire
from common.files import run_files as RF
from common.files.net_stats import read_net_stats
from consumer.server import books
from consumer.server.roster import Census, Roster, aggregate, status_of
from consumer.server.state import ProducerView

G = 2


@pytest.fixture
def server(tmp_path, monkeypatch):
    # after the first write, ledger.json and the producers' files wait for a forced flush
    monkeypatch.setattr(books, "_BOOKS_EVERY_S", 3600.0)
    cfg = C.apply_overrides(
        C.Config(),
        ["net.control_port=0", f"sampling.group_size={G}", "train.prompts_per_step=4",
         "staleness.max_staleness=0"],
    )  # fmt: skip
    with started_server(cfg, tmp_path) as (srv, ctx):
        control = ctx.socket(zmq.DEALER)
        control.connect(f"tcp://127.0.0.1:{srv.ports['control']}")
        yield srv, ctx, control
        control.close(linger=0)


def request(sock: zmq.Socket, msg: wire.Message) -> wire.Message:
    sock.send(wire.encode(msg))
    assert sock.poll(10_000), "no reply from the server"
    return wire.decode(sock.recv(), wire.Limits())


def register(control: zmq.Socket, names: list[str]) -> None:
    for i, name in enumerate(names):
        assert isinstance(
            request(control, wire.Register(i + 1, name, "h", i, "fake", -1)), wire.Welcome
        )


def test_the_step_summary_is_the_same_size_at_1_and_200_producers(server, tmp_path):
    srv, _, control = server
    register(control, ["p0000"])
    srv.flush_ledger()
    one = srv.step_summary()
    register(control, [f"p{i:04d}" for i in range(1, 200)])
    srv.flush_ledger()
    many = srv.step_summary()
    assert one.producers_live == 1
    assert many.producers_live == 200
    assert many.producers_by_state == {"registered": 200}
    size = [len(json.dumps(dataclasses.asdict(s))) for s in (one, many)]
    assert size[1] - size[0] <= 4  # a few more digits, nothing more
    current = RF.read_producers(tmp_path)
    assert len(current) == 200
    assert current["p0123"].state == "registered"
    assert len(RF.read_producer_history(tmp_path)) == 200  # one line each, at their first write
    srv.flush_ledger()
    assert len(RF.read_producer_history(tmp_path)) == 200  # nothing changed: no new line
    request(control, wire.Heartbeat(900, "p0007", 3, "generating", 1, {"groups_sent": 2.0}))
    srv.flush_ledger()
    (row,) = RF.read_producer_history(tmp_path)[200:]
    assert (row.producer, row.version, row.state) == ("p0007", 3, "generating")
    assert RF.read_producers(tmp_path)["p0007"].counters == {"groups_sent": 2.0}


def test_a_settled_step_appends_its_leases_and_leaves_ledger_json_to_housekeeping(server, tmp_path):
    srv, ctx, control = server
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{srv.ports['rollouts']}")
    register(control, ["p"])
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))
    grant = request(control, wire.LeaseRequest(10, "p", 4, 0))
    assert isinstance(grant, wire.LeaseGrant)
    assert len(grant.leases) == 4
    for lease in grant.leases:
        group = wire.Group(
            lease_id=lease.lease_id, producer_id="p", prompt_index=lease.prompt_index,
            behavior_version=0, prompt_ids=np.array([1, 2], np.int32),
            completion_ids=np.array([3, 4], np.int32), completion_lens=np.ones(G, np.int32),
            behavior_logp=np.full(2, -1.0, np.float32), token_versions=np.zeros(0, np.int32),
            rewards=np.array([1.0, 0.0], np.float32), finish_reasons=("stop",) * G,
            temperature=1.0,
        )  # fmt: skip
        push.send(wire.encode(group))
    got = [srv.next_group(timeout_s=10) for _ in grant.leases]
    assert all(g is not None for g in got)
    srv.flush_ledger()
    ledger = tmp_path / RF.LEDGER
    before = ledger.stat().st_ino, ledger.read_text()
    lines_before = RF.read_leases(tmp_path)
    srv.settle_trained([g for g in got if g is not None], trained_step=0)
    srv.wait_books()  # the writer thread appends them (the network thread never waits on disk)
    lines = RF.read_leases(tmp_path)
    assert len(lines) == len(lines_before) + 4  # appended together, whole lines
    assert {x.state for x in lines[-4:]} == {"trained"}
    assert srv.step_summary().totals.trained == 4
    assert (ledger.stat().st_ino, ledger.read_text()) == before  # not rewritten by the step
    srv.flush_ledger()
    written = RF.read_ledger(tmp_path)
    assert written.balance.trained == 4
    assert written.balance.ok
    push.close(linger=0)


def test_the_roster_writes_what_changed_and_aggregates_states(tmp_path):
    views = {
        "a": ProducerView("h", 1, "fake", 0, state="idle"),
        "b": ProducerView("h", 2, "fake", 0, state="gone"),
    }
    roster = Roster(tmp_path)
    roster.apply({p: status_of(v) for p, v in views.items()})
    roster.write()
    assert roster.census == aggregate(views) == Census(1, {"gone": 1, "idle": 1})
    views["a"].loaded_version = 5
    assert RF.read_producers(tmp_path)["a"].version == 0
    roster.apply({"a": status_of(views["a"])})
    roster.write()
    assert RF.read_producers(tmp_path)["a"].version == 5
    roster.apply({"b": None})  # forgotten
    roster.write()
    assert set(RF.read_producers(tmp_path)) == {"a"}
    assert roster.census == Census(1, {"idle": 1})
    assert [(r.producer, r.version) for r in RF.read_producer_history(tmp_path)] == [
        ("a", 0), ("b", 0), ("a", 5),
    ]  # fmt: skip


def test_the_books_are_written_off_the_network_thread_which_answers_meanwhile(
    server, tmp_path, monkeypatch
):
    """While the writer thread is stuck in writing ledger.json, the network thread still
    answers heartbeats; the files are written by "consumer-books", never by "consumer-net"."""
    srv, _, control = server
    register(control, ["a", "b"])
    writers: list[str] = []
    stuck, release = threading.Event(), threading.Event()
    write_ledger = RF.write_ledger

    def slow_write(run_dir, ledger):
        writers.append(threading.current_thread().name)
        stuck.set()
        assert release.wait(30), "the test never released the writer"
        write_ledger(run_dir, ledger)

    monkeypatch.setattr(RF, "write_ledger", slow_write)
    flushed = threading.Thread(target=srv.flush_ledger)
    flushed.start()
    assert stuck.wait(30), "ledger.json was never written"
    reply = request(control, wire.Heartbeat(7, "a", 2, "idle", 0, {"uptime_s": 3.0}))
    assert isinstance(reply, wire.StatusReply)  # answered while the writer is stuck
    assert flushed.is_alive()  # the flush waits for the write, on its caller's thread
    release.set()
    flushed.join(30)
    assert not flushed.is_alive()
    # by the books thread only (the periodic hand-over may have written once more meanwhile)
    assert set(writers) == {"consumer-books"}
    srv.flush_ledger()
    assert RF.read_producers(tmp_path)["a"].counters == {"uptime_s": 3.0}
    assert RF.read_ledger(tmp_path).balance.ok
    stats = read_net_stats(tmp_path)  # written with the books
    assert stats is not None
    assert stats.heartbeats == 1
    assert stats.loop_gap.total() > 0
    from consumer.server.loop import SWITCH_INTERVAL_S

    assert sys.getswitchinterval() == SWITCH_INTERVAL_S  # set by the serving network thread
