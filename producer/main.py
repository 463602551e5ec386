"""The producer process: signals, the follow loop, one consumer run at a time, exit codes.

`asyncio.run(main(cfg))` (what `asyncgrpo producer` runs) resolves the consumer's endpoint
(`net.connect`, or `net.connect_file`), then serves runs: each is one `Producer`
(producer/worker.py) registered, prepared and run by `serve_run` until it ends. SIGINT and
SIGTERM cancel the run (the producer says goodbye, naming the groups it still holds);
SIGUSR1 logs where every task is waiting (`kill -USR1 PID`).

Ending: the consumer says `finished` in its replies (the run is over: exit 0; with
`producer.follow`, wait for the next consumer at the same address instead, up to
`net.consumer_timeout_s`, skipping a consumer that is still saying its run is finished, and serve
that run with a fresh session: the engine is kept when the model is the same, and weights are
taken only from the new run's snapshots), or a signal arrives (goodbye, exit 0), or the
consumer has not answered for `net.consumer_timeout_s`: then `ConsumerLost` ends the producer
with one clear line and exit code 3 (`EXIT_CONSUMER_LOST`), whatever it was doing, so no
producer outlives its consumer for long (a consumer that restarts with `--resume` within that
time is rejoined). A `ConfigError` (no consumer answered the first handshake, a model or
weights that cannot load, our id taken) propagates as itself: the CLI prints its one line and
exits 2.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import zmq.asyncio

from common.config import Config
from common.errors import EXIT_CONSUMER_LOST, ConfigError
from producer.endpoint_file import NoConsumer, resolve_connect
from producer.session import KeptEngine
from producer.worker import ConsumerLost, Producer

log = logging.getLogger("asyncgrpo.producer")


def _log_tasks() -> None:
    """Log where every task of the loop is waiting (its innermost 8 frames)."""
    for task in asyncio.all_tasks():
        frames = task.get_stack(limit=8)
        where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
        log.warning("task %s: %s", task.get_name(), where)


def _prepare_hf(cfg: Config) -> None:
    """For the hf engine: torch's thread count (`producer.torch_threads`), and the modules of
    the model this producer expects to be told (its own, or the run's when local) imported now,
    while the consumer may still be starting."""
    if cfg.producer.engine == "hf":
        import torch

        from producer.engines.hf import import_for

        if cfg.producer.torch_threads:
            torch.set_num_threads(cfg.producer.torch_threads)
        expected = Path(cfg.producer.model or cfg.model.path)
        if (expected / "config.json").is_file():
            import_for(expected)


async def main(cfg: Config) -> int:
    """Run one producer until the consumer says it is finished or a signal arrives; with
    `producer.follow`, go on to the next consumer's run at the same address after each."""
    _prepare_hf(cfg)
    cfg = await resolve_connect(cfg)
    ctx = zmq.asyncio.Context()
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, current.cancel)
    loop.add_signal_handler(signal.SIGUSR1, _log_tasks)  # `kill -USR1 PID`: where is it waiting?
    kept: KeptEngine | None = None
    served = 0
    try:
        while True:
            producer, kept = Producer(cfg, ctx, kept=kept), None  # the producer owns it now
            try:
                code, kept = await serve_run(producer, current)
            except NoConsumer as exc:
                if not served:
                    raise
                log.info("%s runs served; no next one: %s", served, exc)
                return 0
            served += 1
            if kept is None:
                return code
            log.info(
                "run %s finished: waiting for the next consumer at %s (producer.follow)",
                producer.state.run_id,
                cfg.net.connect,
            )
    finally:
        if kept is not None:
            await kept[1].close()
        ctx.term()


async def run(producer: Producer) -> int:
    """Register, prepare and run `producer`'s tasks until the consumer says it is finished or the
    calling task is cancelled (goodbye, 0); `EXIT_CONSUMER_LOST` when the consumer went silent.
    Closes the producer's sockets, not its context (many producers may share one)."""
    current = asyncio.current_task()
    assert current is not None
    code, _ = await serve_run(producer, current)
    return code


async def serve_run(
    producer: Producer, current: asyncio.Task[int]
) -> tuple[int, KeptEngine | None]:
    """One consumer's run: (exit code, the engine kept for the next run when the run finished
    and `producer.follow` is on)."""
    reader = asyncio.create_task(producer.control.read_replies(), name="replies")
    link = asyncio.create_task(producer.control.watch_link(), name="link")
    code, finished = 0, False
    try:
        spec = await producer.setup()
        async with asyncio.TaskGroup() as tg:
            heartbeat = tg.create_task(producer.heartbeat_loop(), name="heartbeat")
            session = await producer.prepare(spec)
            background = [
                heartbeat,
                tg.create_task(producer.announce_loop(spec), name="announce"),
                tg.create_task(producer.release_loop(session.outbox), name="release"),
                tg.create_task(producer.weights.keep_loaded(session.engine), name="weights"),
                *([tg.create_task(producer.relay.serve(), name="relay")] if producer.relay else []),
            ]
            await producer.lease_loop(tg, session)
            finished = True
            for task in background:
                task.cancel()
    except asyncio.CancelledError:
        current.uncancel()
        log.info("stopping: telling the consumer which groups we still hold")
    except BaseExceptionGroup as group:  # a task of the group failed
        lost, other = group.split(ConsumerLost)
        if other is not None:
            refused, rest = other.split(ConfigError)  # e.g. our id taken at re-registration
            if refused is not None and rest is None:
                raise refused.exceptions[0] from None
            raise
        assert lost is not None
        log.error("%s", lost.exceptions[0])
        code = EXIT_CONSUMER_LOST
    finally:
        await producer.goodbye()
        reader.cancel()
        link.cancel()
        kept = await producer.close(keep_engine=finished and producer.cfg.producer.follow)
    return code, kept
