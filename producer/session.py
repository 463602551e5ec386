"""A producer's session: what it works with for one consumer run, built from the run spec.

`open_session(cfg, spec, ...)` runs once the producer has registered (the consumer's `RunSpec`
says G, sampling, reward functions, prompt format, vocabulary and ports) while heartbeats
already run: it checks the model directory, builds the tokenizer (`PromptCodec`), the engine
(`producer.engines.make_engine`, on a thread: loading can take long), the rewards
(`producer.rewards.scoring.make_rewards`), the episodes' environment and turn renderer when
the run samples multi-turn episodes (`producer.episodes.open_episodes`; `episodes` is None
otherwise) and the outbox on the consumer's rollouts port.

With `producer.follow` a finished run's engine is handed to the next run (`KeptEngine`) and
reused when the model directory and vocabulary are the same; otherwise it is closed first.
A model that does not load is a `ConfigError` with one line naming whose model it was
(`--model`, or the consumer's `model.path`): the producer exits 2.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import zmq.asyncio

from common import wire
from common.config import Config
from common.errors import ConfigError, first_line
from common.sampling.kept_set import Truncation
from producer.engines import make_engine
from producer.engines.base import Engine
from producer.episodes import Episodes, open_episodes
from producer.outbox import Outbox
from producer.rewards.scoring import Rewards, make_rewards
from producer.tokenizer import PromptCodec

# (model dir, vocab size, truncation): an engine fits a run with the same key (vLLM's
# max_logprobs follows the truncation's max_kept)
EngineKey = tuple[str, int, Truncation]
KeptEngine = tuple[EngineKey, Engine]  # an engine kept between runs (producer.follow)


@dataclass(frozen=True, slots=True, eq=False)
class Session:
    """What a producer works with once registered and prepared (`Producer.prepare`)."""

    spec: wire.RunSpec  # the consumer's run: G, sampling, rewards, ports
    engine: Engine
    codec: PromptCodec
    rewards: Rewards  # the run's reward functions, or the fake engine's coins
    outbox: Outbox  # every finished group until it is acknowledged
    episodes: Episodes | None = None  # a multi-turn run's environment and turns


async def open_session(
    cfg: Config,
    spec: wire.RunSpec,
    *,
    kept: KeptEngine | None,
    rng: random.Random,
    push: Callable[[], zmq.asyncio.Socket],
    fetch: Callable[[tuple[wire.ModelFile, ...]], Awaitable[Path]] | None = None,
) -> tuple[Session, EngineKey]:
    """The session of `spec`'s run, and its engine's key. `kept`: a previous run's engine, used
    when its key matches (else closed); `rng` draws the seed of a new engine; `push` opens the
    outbox's socket; `fetch` gets the consumer's model when this host has no copy of it
    (producer/base_model.py)."""
    model_dir, whose = _model_dir(cfg, spec, fetchable=fetch is not None)
    if model_dir is not None and fetch is not None and not (model_dir / "config.json").exists():
        model_dir = await fetch(spec.model_files)
    truncation = truncation_of(spec)
    key = (str(model_dir), spec.vocab_size, truncation)
    engine: Engine | None = None
    if kept is not None:  # the previous run's engine (producer.follow)
        kept_key, engine = kept
        if kept_key != key:
            await engine.close()
            engine = None
    try:
        codec = PromptCodec(model_dir, spec.prompt_format, vocab_size=spec.vocab_size)
        if engine is None:
            engine = await asyncio.to_thread(
                make_engine,
                cfg,
                model_dir=model_dir,
                vocab_size=spec.vocab_size,
                seed=rng.randrange(1 << 30),
                truncation=truncation,
                max_staleness=spec.max_staleness,
            )
    except (OSError, ValueError, RuntimeError, ImportError) as exc:  # a model that won't load
        raise ConfigError(
            f"cannot load the model {str(model_dir)!r} ({whose}) on this producer's host: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
    episodes = open_episodes(spec.episodes, codec, workers=cfg.episodes.workers)
    rewards = make_rewards(cfg, spec, codec)
    outbox = Outbox(push(), resend_after_s=cfg.net.resend_after_s)
    return Session(spec, engine, codec, rewards, outbox, episodes), key


def truncation_of(spec: wire.RunSpec) -> Truncation:
    """The run's truncated sampling (top-k, top-p, min-p, max_kept), as the consumer said."""
    return Truncation(spec.top_k, spec.top_p, spec.min_p, spec.max_kept)


def _model_dir(
    cfg: Config, spec: wire.RunSpec, *, fetchable: bool = False
) -> tuple[Path | None, str]:
    """(the model directory on this host, None for the fake engine; whose model it is, for
    messages). Raises `ConfigError` when it is not a Hugging Face model directory, unless it is
    the consumer's and the run spec lists its files to fetch (`fetchable`: a way to fetch)."""
    model_dir = Path(cfg.producer.model or spec.model) if cfg.producer.engine != "fake" else None
    whose = (
        "this producer's producer.model (--model)"
        if cfg.producer.model
        else "the consumer's model.path, announced to producers"
    )
    fetched = fetchable and not cfg.producer.model and bool(spec.model_files)
    if model_dir is not None and not fetched and not (model_dir / "config.json").exists():
        raise ConfigError(
            f"model directory {str(model_dir)!r} ({whose}) is not a Hugging Face model "
            "directory on this producer's host: pass --model with a local copy of the "
            "learner's model (--model demo when the consumer trains the embedded demo)"
        )
    return model_dir, whose
