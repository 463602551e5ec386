"""A consumer's network thread (consumer/server/server.py's `Server`) started in this process on
a run directory, for the tests that talk to it over real loopback sockets; and the other side's
`fake_session`, a producer's session with the fake engine and fake rewards.

`started_server` owns what it builds: the ZeroMQ context, the CurveZMQ key gate when `keys` is
given, and the server; all are stopped (server first, then the gate, then the context with
linger 0) when the block ends, whether or not it raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common import wire
from common.config import Config, apply_overrides
from common.net.keys import Keys
from consumer.data.prompts import make_source
from consumer.key_gate import start_key_gate
from consumer.server.server import Server
from consumer.server.wire_terms import run_spec
from producer.engines.fake import FakeEngine
from producer.outbox import Outbox
from producer.rewards.scoring import FakeRewards
from producer.session import Session
from producer.tokenizer import PromptCodec
from producer.worker import Producer


def request(sock: zmq.Socket[Any], msg: wire.Message) -> wire.Message:
    """Send `msg` on a control socket and decode its reply (10 s at most)."""
    sock.send(wire.encode(msg))
    assert sock.poll(10_000), "no reply from the server"
    return wire.decode(sock.recv(), wire.Limits())


def two_completions(lease: wire.Lease, rewards: list[float]) -> wire.Group:
    """Producer "p"'s group of G = 2 one-token completions for `lease`."""
    G = len(rewards)
    return wire.Group(
        lease_id=lease.lease_id,
        producer_id="p",
        prompt_index=lease.prompt_index,
        behavior_version=0,
        prompt_ids=np.array([1, 2], np.int32),
        completion_ids=np.array([3, 4], np.int32),
        completion_lens=np.ones(G, np.int32),
        behavior_logp=np.full(2, -1.0, np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.array(rewards, np.float32),
        finish_reasons=("stop",) * G,
        temperature=1.0,
    )


# A synchronous run of one prompt per step, G = 2, lease requests answered at once.
ONE_PROMPT = [
    "net.control_port=0",
    "sampling.group_size=2",
    "train.prompts_per_step=1",
    "staleness.max_staleness=0",
    "net.lease_wait_s=0",
]


@contextlib.contextmanager
def one_group_admitted(
    run_dir: Path,
) -> Iterator[tuple[Server, zmq.Socket[Any], wire.Lease, wire.Group]]:
    """A started server of the `ONE_PROMPT` run whose producer "p" (its control socket is
    given) holds one lease whose group (rewards 1, 0) the server admitted."""
    cfg = apply_overrides(Config(), ONE_PROMPT)
    with started_server(cfg, run_dir) as (srv, ctx):
        control = ctx.socket(zmq.DEALER)
        control.connect(f"tcp://127.0.0.1:{srv.ports['control']}")
        push = ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{srv.ports['rollouts']}")
        try:
            assert isinstance(
                request(control, wire.Register(1, "p", "h", 1, "fake", -1)), wire.Welcome
            )
            srv.announce_snapshot(wire.SnapshotInfo(0, 1, "00", str(run_dir / "none")))
            (lease,) = request(control, wire.LeaseRequest(2, "p", 4, 0)).leases
            push.send(wire.encode(two_completions(lease, [1.0, 0.0])))
            got = srv.next_group(timeout_s=10)
            assert got is not None, "the group was not admitted"
            yield srv, control, lease, got
        finally:
            control.close(linger=0)
            push.close(linger=0)


@contextlib.contextmanager
def started_server(
    cfg: Config,
    run_dir: Path,
    *,
    keys: Keys | None = None,
    vocab_size: int = 32,
    model: str = "",
) -> Iterator[tuple[Server, zmq.Context[Any]]]:
    """A started `Server` for `cfg` on `run_dir` (prompts from `cfg.task`, seed 0; the run spec
    of a `vocab_size`-token `model`), and its context for the test's own sockets. With `keys`,
    the server speaks CurveZMQ and admits the clients whose public keys lie in `keys.directory`.
    """
    ctx: zmq.Context[Any] = zmq.Context()
    gate = start_key_gate(ctx, keys) if keys is not None else None
    try:
        server = Server(
            cfg,
            ctx,
            prompts=make_source(cfg.task, seed=0),
            spec=run_spec(cfg, vocab_size=vocab_size, model=model),
            run_dir=run_dir,
            keys=keys,
        )
        server.start()
        try:
            yield server, ctx
        finally:
            server.stop()
    finally:
        if gate is not None:
            gate.stop()
        ctx.destroy(linger=0)


def fake_session(producer: Producer) -> Session:
    """A session of `producer`'s config with the fake engine and fake rewards, its outbox on an
    unconnected PUSH socket of the producer's context (re-sending after 60 s)."""
    return Session(
        spec=run_spec(producer.cfg, vocab_size=16, model=""),
        engine=FakeEngine(vocab_size=16, eos_token_id=15, seed=0),
        codec=PromptCodec(None, "raw", vocab_size=16),
        rewards=FakeRewards(run_seed=0, p=0.5),
        outbox=Outbox(producer.ctx.socket(zmq.PUSH), resend_after_s=60.0),
    )
