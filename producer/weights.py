"""Keeping the newest snapshot loaded: the producer's `weights` task and where its files come from.

`Weights.keep_loaded(engine)` watches the newest snapshot the consumer has announced
(`State.target`, from status replies and announcements) and loads it into the engine whenever it
is not the one loaded, or was loaded from another consumer incarnation (a resumed consumer may
publish lower or equal versions of another lineage: `State.weights_run` says whose weights the
engine holds). `fetch(info)` gives the engine a private directory holding the verified file:
- the consumer's own file when this host sees it (shared filesystem), pinned by a link of the
  producer's own so that the bytes loaded are the bytes checked
  (`common.weights.snapshot.pin_local`). A file the consumer wrote on this very host is taken on its
  manifest's hash (`producer.trust_local_hash`): the writer hashed the memory it wrote, and one page
  cache serves both processes, so reading and hashing it again would only add latency; any other is
  hashed;
- else over the network (producer/fetch/fetcher.py: chunks from the consumer's data socket or
  relays; a delta on the file held here when the consumer offers one).
The private cache keeps the two newest directories (the engine's, and the next).

Invariants: no reload starts while an evaluation group is being sampled (`State.pins`: it must
be sampled with exactly the version its lease names), and no evaluation group starts during a
reload (`State.loading`); a snapshot that fails verification is never loaded (the engine keeps
its weights, the failure is counted and logged, and a newer announcement is taken at once); a
snapshot superseded while it was fetched is skipped, not backed off from; a verified snapshot
that does not fit the model (names, shapes) raises `ConfigError` (the producer exits 2): that
cannot get better by retrying (a LoRA adapter trained on another base model than this
producer's is one: counted as `adapters_wrong_base`, common/weights/adapter.py). Counters
(`reloads`, `reload_s`, `fetch_s`, `snapshots_*`) go to `State.counters`; the fetcher's own go
out through `counters`. At INFO, one line per snapshot loaded (`loaded weights vN (where it came
from)`): never more than one per learner step.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from pathlib import Path

import zmq.asyncio

from common import wire
from common.config import Config
from common.errors import ConfigError, SnapshotError, SnapshotMismatch
from common.net.keys import Keys
from common.weights import snapshot as snap
from common.weights.adapter import AdapterBaseMismatch
from producer.control import ControlClient, Rejected
from producer.engines.base import Engine
from producer.fetch.fetcher import Fetcher, Held, Report
from producer.fetch.relay import Relay
from producer.state import State

log = logging.getLogger("asyncgrpo.producer")


class Weights:
    """The keeper of the engine's weights for one `Producer` (one consumer run); see the module
    docstring. `close` removes its private cache."""

    def __init__(
        self,
        cfg: Config,
        state: State,
        control: ControlClient,
        ctx: zmq.asyncio.Context,
        *,
        keys: Keys | None,
        max_message_bytes: int,
        relay: Relay | None,
        timeout_s: float,
        report: Report,
    ) -> None:
        self.cfg, self.state = cfg, state
        self.cache = Path(tempfile.mkdtemp(prefix="asyncgrpo-snapshots-"))
        self.fetcher = Fetcher(
            control,
            ctx,
            data_endpoint="",
            producer_id=state.producer_id,
            keys=keys,
            max_message_bytes=max_message_bytes,
            relay=relay,
            timeout_s=timeout_s,
            report=report,
        )
        self.held: Held | None = None  # the newest snapshot file fetched and verified here
        self.source = ""  # where the last snapshot fetched came from: its `loaded weights` line

    @property
    def counters(self) -> dict[str, float]:
        """The fetcher's counters (its sources, chunks and bytes)."""
        return self.fetcher.counters

    async def keep_loaded(self, engine: Engine) -> None:
        """The `weights` task: load the newest announced snapshot of the consumer's current run
        into `engine` whenever it is not the one loaded; runs until cancelled. Raises
        `ConfigError` for weights that can never fit the engine's model."""
        while True:
            seen = self.state.changed.count
            target, run = self.state.target, self.state.run_id
            if target is None or (
                target.version == engine.version and self.state.weights_run == run
            ):
                await self.state.changed.wait(seen, 5.0)
                continue
            try:
                directory = await self.fetch(target)
                # an eval group in flight pins the weights it is sampled with
                while self.state.pins:
                    await self.state.changed.wait(self.state.changed.count, 1.0)
                t0 = time.perf_counter()
                self.state.loading = True  # no eval lease starts from here (worker.py)
                try:
                    await engine.load_weights(directory, target.version)
                finally:
                    self.state.loading = False
                self.state.weights_run = run
                self.state.count("reloads")
                self.state.count("reload_s", time.perf_counter() - t0)
                log.info("loaded weights v%d (%s)", target.version, self.source)
                self.state.changed.bump()
            except SnapshotMismatch as exc:  # the model is wrong: retrying can never help
                if isinstance(exc, AdapterBaseMismatch):  # a LoRA adapter of another base
                    self.state.count("adapters_wrong_base")
                raise ConfigError(
                    f"the learner's weights can never load into this producer's model ({exc}): "
                    + self._whose_model()
                ) from exc
            except (SnapshotError, Rejected, TimeoutError) as exc:
                if self.state.target is not target:
                    # A newer snapshot was announced meanwhile; the consumer keeps only the last
                    # few, so this one may simply have been rotated away. Go to the newer one.
                    self.state.count("snapshots_superseded")
                    log.debug("snapshot v%d superseded before it was loaded", target.version)
                    continue
                self.state.count("snapshot_failures")
                log.warning(
                    "snapshot v%d not loaded (%s); keeping v%d",
                    target.version,
                    exc,
                    engine.version,
                )
                # Back off, but take a newer announcement at once.
                deadline = time.monotonic() + 1.0
                while self.state.target is target and (left := deadline - time.monotonic()) > 0:
                    await self.state.changed.wait(self.state.changed.count, left)

    async def fetch(self, info: wire.SnapshotInfo) -> Path:
        """A private directory holding the verified `model.safetensors` of `info`, which the
        engine then loads: the consumer's own file when this host sees it, pinned so that the
        bytes loaded are the bytes verified (`common.weights.snapshot.pin_local`; taken on its
        manifest when written here, see `producer.trust_local_hash`; else hashed), else
        fetched over the network (producer/fetch/fetcher.py). Counted in the producer's counters."""
        t0 = time.perf_counter()
        unusable = ""
        local = Path(info.path)
        directory = self.cache / f"v{info.version:06d}"
        if await asyncio.to_thread(local.is_file):  # may be a slow shared filesystem
            try:
                _, trusted = await asyncio.to_thread(
                    snap.pin_local,
                    local,
                    directory,
                    expected_hash=info.hash,
                    expected_bytes=info.num_bytes,
                    trust_writer=self.cfg.producer.trust_local_hash,
                )
                self.state.count("snapshots_local_trusted" if trusted else "snapshots_local")
                self.source = "the consumer's file, " + ("trusted" if trusted else "hashed")
                self.state.count("fetch_s", time.perf_counter() - t0)
                self._prune_cache()
                return directory
            except SnapshotError as exc:
                unusable = f"; the consumer's file was unusable here: {exc}"
        directory = self.cache / f"v{info.version:06d}"
        outcome = await self.fetcher.fetch(info, directory, held=self.held)
        self.held = Held(info.version, directory / snap.WEIGHTS_FILE, info.hash)
        self.state.count("snapshots_fetched")
        self.state.count(f"snapshots_fetched_{outcome.file}")
        self.state.count("fetch_bytes", outcome.num_bytes)
        self.state.count("fetch_s", time.perf_counter() - t0)
        took = time.perf_counter() - t0
        self.source = (
            f"fetched over the network ({info.num_bytes} bytes in {took:.2f} s), "
            f"BLAKE3 hash verified{unusable}"
        )
        self._prune_cache()
        return directory

    def _prune_cache(self) -> None:
        """Keep the two newest private snapshot directories (the engine's, and the next)."""
        for old in sorted(self.cache.iterdir())[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def _whose_model(self) -> str:
        if self.cfg.producer.model:
            return (
                f"this producer's --model {self.cfg.producer.model!r} must be a copy of "
                "the learner's model (same architecture and tokenizer)"
            )
        return (
            "the model the consumer announced differs on this host: pass --model with a "
            "copy of the learner's model"
        )

    def close(self) -> None:
        shutil.rmtree(self.cache, ignore_errors=True)
