"""Evaluation leases through the real server (consumer/server/: control, intake, eval_book):
real sockets on loopback, scripted producers.

What must hold: eval leases come before training leases and only to a producer that reports
the evaluated version; evaluation groups never reach the learner's queue and are counted apart
from the training ledger; the version's result is reported once every held-out prompt is in.
"""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from served import started_server

from common import config as C
from common import wire
from consumer.evaluation.rounds import EVAL_BIT

G, K, PROMPTS = 2, 3, 3


@pytest.fixture
def server(tmp_path):
    cfg = C.apply_overrides(
        C.Config(),
        ["net.control_port=0", f"sampling.group_size={G}", "train.prompts_per_step=4",
         "staleness.max_staleness=0", "net.lease_wait_s=0", "eval.every_steps=2",
         f"eval.samples_per_prompt={K}", f"eval.max_prompts={PROMPTS}", "eval.temperature=0.5"],
    )  # fmt: skip
    with started_server(cfg, tmp_path) as served:
        yield served


def _request(sock: zmq.Socket, msg: wire.Message) -> wire.Message:
    sock.send(wire.encode(msg))
    assert sock.poll(10_000), "no reply from the server"
    return wire.decode(sock.recv(), wire.Limits(max_leases=64, max_acks=64))


def _group(lease: wire.Lease, producer: str, rewards: list[float], *, evaluation: bool):
    n = len(rewards)
    return wire.Group(
        lease_id=lease.lease_id, producer_id=producer, prompt_index=lease.prompt_index,
        behavior_version=0, prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.full(2 * n, 3, np.int32), completion_lens=np.full(n, 2, np.int32),
        behavior_logp=np.full(2 * n, -1.0, np.float32), token_versions=np.zeros(0, np.int32),
        rewards=np.array(rewards, np.float32), finish_reasons=("stop",) * n,
        temperature=0.5 if evaluation else 1.0, evaluation=evaluation,
    )  # fmt: skip


def test_eval_leases_come_first_only_for_the_version_held_and_are_never_trained(server, tmp_path):
    srv, ctx = server
    host = "tcp://127.0.0.1"
    socks = {}
    for name in ("old", "new"):
        socks[name] = ctx.socket(zmq.DEALER)
        socks[name].connect(f"{host}:{srv.ports['control']}")
        assert isinstance(_request(socks[name], wire.Register(1, name, "h", 1, "fake", -1)),
                          wire.Welcome)  # fmt: skip
    push = ctx.socket(zmq.PUSH)
    push.connect(f"{host}:{srv.ports['rollouts']}")
    srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(tmp_path / "none")))  # round of v0

    # a producer still without v0 gets training leases only; the round has no version yet
    reply = _request(socks["old"], wire.LeaseRequest(2, "old", 2, -1))
    old = reply.leases
    assert [x.eval_version for x in old] == [-1, -1]
    assert (reply.status.eval_version, reply.status.eval_from) == (-1, 0)
    # one that holds v0 and asks for eval leases beyond its 2 training slots: every eval lease
    # first, then its training leases
    reply = _request(socks["new"], wire.LeaseRequest(2, "new", 2, 0, (), PROMPTS - 1))
    new = reply.leases
    assert [x.eval_version for x in new] == [0, 0, -1, -1]
    assert reply.status.eval_version == 0  # one prompt of v0's round is left to lease
    reply = _request(socks["new"], wire.LeaseRequest(3, "new", 1, 0, (), 1))
    new += reply.leases
    assert [x.eval_version for x in new] == [0, 0, -1, -1, 0]  # one step of 4 prompts: all out
    assert reply.status.eval_version == -1  # the round is all leased
    new = tuple(sorted(new, key=lambda x: x.eval_version, reverse=True))
    evals = new[:PROMPTS]
    assert all(x.lease_id & EVAL_BIT for x in evals)
    assert all(not x.lease_id & EVAL_BIT for x in old + new[PROMPTS:])

    for lease, rewards in zip(evals, ([1.0, 0.0, 0.0], [0.0] * K, [1.0] * K), strict=True):
        push.send(wire.encode(_group(lease, "new", rewards, evaluation=True)))
    push.send(wire.encode(_group(old[0], "old", [1.0, 0.0], evaluation=False)))
    got = srv.next_group(timeout_s=10)  # the groups of one socket arrive in order
    assert got is not None
    assert got.lease_id == old[0].lease_id  # the eval groups never reached the learner's queue
    assert not got.evaluation

    taken = srv.take_eval()
    assert taken["eval_version"] == 0
    assert taken["eval_prompts"] == PROMPTS
    assert taken["eval_reward_mean"] == pytest.approx(4 / 9)
    assert taken["eval_pass_at_1"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert taken["eval_pass_at_k"] == pytest.approx(2 / 3)
    assert taken["eval_leases_answered"] == PROMPTS
    assert "eval_version" not in srv.take_eval()  # reported once
    status = _request(socks["new"], wire.Heartbeat(3, "new", 0, "idle", 0)).status
    assert {a.outcome for a in status.acks} == {wire.EVALUATED}
    assert len(status.acks) == PROMPTS

    balance = srv.balance()  # the training ledger knows nothing of eval leases
    assert balance.issued == len(old) + len(new) - PROMPTS
    assert balance.ok
    push.close(linger=0)
    for s in socks.values():
        s.close(linger=0)


def test_the_wait_for_a_round_ends_when_it_is_not_begun_or_the_run_stops(server):
    import threading

    srv, _ = server
    stop = threading.Event()
    assert not srv.await_round(7, 0.2, stop)  # v7 was never published: no round, the bound
    stop.set()
    assert not srv.await_round(7, 600.0, stop)  # Ctrl-C: at once, whatever the bound
