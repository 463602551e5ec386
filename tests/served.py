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

import zmq

from common.config import Config
from common.net.keys import Keys
from consumer.data.prompts import make_source
from consumer.key_gate import start_key_gate
from consumer.server.server import Server, run_spec
from producer.engines.fake import FakeEngine
from producer.outbox import Outbox
from producer.rewards.scoring import FakeRewards
from producer.session import Session
from producer.tokenizer import PromptCodec
from producer.worker import Producer


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
            cfg, ctx, prompts=make_source(cfg.task, seed=0),
            spec=run_spec(cfg, vocab_size=vocab_size, model=model), run_dir=run_dir, keys=keys,
        )  # fmt: skip
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
