"""Fetching a snapshot over the network: ask the consumer for a plan, take every chunk from the
sources it names, check each against its hash, and apply a delta on exactly its base.

`Fetcher.fetch(info, directory, held=)` leaves `directory/model.safetensors` holding the bytes of
`info` (size and BLAKE3 hash as announced) or raises; what it does:

1. `wire.FetchRequest` over control (the authenticated channel) names the version wanted and the
   verified file this producer holds (`Held`); the consumer answers with a `wire.FetchPlan`
   (consumer/snapshots/fanout.py): the full weights, or a delta when `held` is exactly its base;
   per-chunk digests; sources in order (a relay, then the consumer). A plan with `wait_s` means
   every source is busy: ask again after that long.
2. Chunks are fetched with `window` requests in flight per fetch
   (producer/fetch/chunk_client.py: the consumer's data socket, consumer/snapshots/dataplane.py, or
   a relay), written at their offsets and hashed as a whole file as they land
   (common/weights/snapshot.py `IncomingFile`); the received frame is written and hashed as it is,
   never copied. A relay's chunk is accepted only if it hashes to its digest
   (common/weights/chunk_manifest.py); the consumer's chunks skip that second hash, as a wrong byte
   from the consumer fails the whole-file hash, which ends the fetch just as a failed chunk
   digest from the consumer would. A relay that sends wrong bytes, a short chunk, refuses, or
   sends nothing at all for `relay_timeout_s` and then does not answer a probe within as long
   again (producer/fetch/chunk_client.py), or does not answer one request within
   `timeout_s`, is dropped for the rest of the fetch (`wire.BadSource`, counted) and its
   chunks are fetched from the next source; the consumer is the last source, and an error
   from it ends the fetch as before. At most
   `2 * window` chunks ahead of the hashed prefix are requested, so memory stays bounded
   whatever a slow source does. When this producer relays, every chunk (the consumer's too) is
   checked against its digest before it is written, and its relay serves it from then on
   (`Relay.begin` / `ready`, the whole file by `offer` once verified, `abort` if the fetch
   fails): producers below it in the tree stream the file while it arrives here.
3. A delta is applied to a copy of the held file (common/weights/delta.py `apply_file`: only on
   exactly its base hash, the result checked against the snapshot's hash). A refused delta
   (another base, a failed digest) is counted (`delta_refused`) and the full weights are
   fetched instead.
4. `wire.FetchDone` reports the outcome and the bad sources, and, when this producer relays
   (producer/fetch/relay.py), that it now serves the files it fetched whole. It goes out through
   `report` (the producer's `Producer.request_status`), which applies the status the consumer
   answers with like that of any other request: the acks and the end of the run it carries are
   handed over once, and would be lost if the reply were dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from common import wire
from common.errors import SnapshotError
from common.net.keys import Keys
from common.weights import chunk_manifest as cm
from common.weights import delta as D
from common.weights import snapshot as snap
from producer.control import ControlClient, Rejected
from producer.fetch.chunk_client import ChunkClient
from producer.fetch.relay import Relay

log = logging.getLogger("asyncgrpo.producer")
CONSUMER = ""
Report = Callable[[wire.FetchDone], Awaitable[object]]  # send a report, apply its reply's status


@dataclass(frozen=True, slots=True)
class Held:
    """A verified snapshot file this producer holds (a delta's possible base)."""

    version: int
    path: Path
    hash: str


@dataclass(slots=True)
class Outcome:
    """What one fetch did: the file fetched (`weights` or `delta`), bytes received, bad sources."""

    file: str
    num_bytes: int
    bad_sources: list[wire.BadSource]


class _BadChunk(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Fetcher:
    def __init__(
        self,
        control: ControlClient,
        ctx: zmq.asyncio.Context,
        *,
        data_endpoint: str,
        producer_id: str,
        keys: Keys | None,
        max_message_bytes: int,
        report: Report,
        relay: Relay | None = None,
        window: int = 8,
        timeout_s: float = 10.0,
        relay_timeout_s: float = 5.0,
    ) -> None:
        self.control, self.ctx, self.keys = control, ctx, keys
        self.data_endpoint = (
            data_endpoint  # the consumer's data socket (consumer/snapshots/dataplane.py)
        )
        self.producer_id, self.relay, self.report = producer_id, relay, report
        self.max_message_bytes = max_message_bytes
        self.window, self.timeout_s, self.relay_timeout_s = window, timeout_s, relay_timeout_s
        self.counters: dict[str, float] = {}

    async def fetch(
        self, info: wire.SnapshotInfo, directory: Path, *, held: Held | None
    ) -> Outcome:
        """Fetch `info` into `directory/model.safetensors` (see the module doc). Raises
        `SnapshotError`, `Rejected` or `TimeoutError` when it cannot."""
        if self.relay is None:
            return await self._fetch(info, directory, held)
        self.relay.expect(info.version)  # asked for it as soon as the plan names this relay
        try:
            return await self._fetch(info, directory, held)
        finally:
            self.relay.settle(info.version)

    async def _fetch(self, info: wire.SnapshotInfo, directory: Path, held: Held | None) -> Outcome:
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        if held is not None and not await asyncio.to_thread(held.path.is_file):
            held = None  # pruned from the cache meanwhile: nothing to apply a delta on
        plan = await self._plan(info, held)
        if plan.file == "delta":
            assert held is not None
            try:
                return await self._fetch_delta(info, plan, directory, held)
            except D.DeltaError as exc:
                self._count("delta_refused")
                log.warning(
                    "delta for v%d refused (%s): fetching the full weights", info.version, exc
                )
                plan = await self._plan(info, None)
        outcome = Outcome("weights", 0, [])
        ok = False
        try:
            await self._download(plan, directory / snap.WEIGHTS_FILE, outcome)
            ok = True
        finally:
            await self._report(plan, ok, outcome)
        return outcome

    async def _fetch_delta(
        self, info: wire.SnapshotInfo, plan: wire.FetchPlan, directory: Path, held: Held
    ) -> Outcome:
        outcome = Outcome("delta", 0, [])
        delta_path = directory / D.DELTA_FILE
        weights = directory / snap.WEIGHTS_FILE
        part = weights.with_name(weights.name + ".part")
        ok = False
        try:
            await self._download(plan, delta_path, outcome)
            part.unlink(missing_ok=True)
            await asyncio.to_thread(D.apply_file, held.path, delta_path, part, base_hash=held.hash)
            await asyncio.to_thread(part.replace, weights)
            ok = True
        finally:
            await self._report(plan, ok, outcome)
        self._count("deltas_applied")
        if self.relay is not None:  # the delta is served since its download ended
            self.relay.offer(info.version, "weights", weights)
        return outcome

    async def _plan(self, info: wire.SnapshotInfo, held: Held | None) -> wire.FetchPlan:
        msg = wire.FetchRequest(
            req=0,
            producer_id=self.producer_id,
            version=info.version,
            held_version=held.version if held else -1,
            held_hash=held.hash if held else "",
            relay=self.relay.source if self.relay else None,
        )
        deadline = time.monotonic() + 30 * self.timeout_s
        while True:
            plan = await self.control.request(msg, timeout_s=self.timeout_s)
            if not isinstance(plan, wire.FetchPlan) or plan.version != info.version:
                raise SnapshotError(f"snapshot v{info.version}: the consumer sent no fetch plan")
            if plan.sources:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"snapshot v{info.version}: every source stayed busy")
            await asyncio.sleep(max(plan.wait_s, 0.01))
        chunks = cm.ChunkHashes(plan.num_bytes, plan.chunk_bytes, plan.chunk_hashes)
        if plan.result_hash != info.hash or not chunks.consistent():
            raise SnapshotError(f"snapshot v{info.version}: the fetch plan disagrees with it")
        if plan.file == "weights" and (plan.hash != info.hash or plan.num_bytes != info.num_bytes):
            raise SnapshotError(f"snapshot v{info.version}: the fetch plan disagrees with it")
        if plan.file == "delta" and (held is None or plan.base_version != held.version):
            raise SnapshotError(f"snapshot v{info.version}: a delta for a base not held")
        return plan

    async def _report(self, plan: wire.FetchPlan, ok: bool, outcome: Outcome) -> None:
        msg = wire.FetchDone(
            req=0,
            producer_id=self.producer_id,
            version=plan.version,
            file=plan.file,
            ok=ok,
            num_bytes=outcome.num_bytes,
            bad_sources=tuple(outcome.bad_sources),
            serving=ok and self.relay is not None,
        )
        with contextlib.suppress(TimeoutError, Rejected):  # a lost report only costs a slot
            await self.report(msg)

    # -- chunks --------------------------------------------------------------------------------
    async def _download(self, plan: wire.FetchPlan, path: Path, outcome: Outcome) -> None:
        chunks = cm.ChunkHashes(plan.num_bytes, plan.chunk_bytes, plan.chunk_hashes)
        part = path.with_name(path.name + ".part")
        incoming = await asyncio.to_thread(
            snap.IncomingFile, part, expected_hash=plan.hash, expected_bytes=plan.num_bytes
        )
        if self.relay is not None:  # served onward chunk by chunk, as each is checked here
            self.relay.begin(plan.version, plan.file, part, chunks)
        sources = list(plan.sources)
        clients: dict[str, ChunkClient] = {}
        todo = deque(range(chunks.num_chunks))
        running: dict[asyncio.Task[bytes | memoryview], tuple[int, wire.Source]] = {}
        try:
            while todo or running:
                ahead = incoming.hashed // max(chunks.chunk_bytes, 1) + 2 * self.window
                while todo and len(running) < self.window and todo[0] < ahead:
                    index, source = todo.popleft(), sources[0]
                    task = asyncio.ensure_future(
                        self._chunk(plan, chunks, index, source, clients, incoming)
                    )
                    running[task] = (index, source)
                if not running:  # the next chunks wait for the prefix: cannot happen
                    raise SnapshotError("fetch stalled with nothing in flight")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index, source = running.pop(task)
                    try:
                        data = task.result()
                    except _BadChunk as exc:
                        if source.endpoint == CONSUMER:
                            raise SnapshotError(
                                f"snapshot v{plan.version}: chunk {index} from the consumer "
                                f"does not match the chunk hashes ({exc.reason})"
                            ) from None
                        self._drop(source, exc.reason, sources, outcome)
                        todo.appendleft(index)
                        continue
                    offset, _ = chunks.span(index)
                    await asyncio.to_thread(incoming.follow, offset, data)  # the file's hash
                    outcome.num_bytes += len(data)
                    self._count(
                        "chunks_from_consumer" if not source.endpoint else "chunks_from_relay"
                    )
            await asyncio.to_thread(incoming.finish)
            part.replace(path)  # on the loop: the relay never finds the file between two names
        except BaseException:
            for task in running:
                task.cancel()
            if self.relay is not None:
                self.relay.abort(plan.version, plan.file)
            incoming.close()
            part.unlink(missing_ok=True)
            raise
        finally:
            for client in clients.values():
                client.close()
        if self.relay is not None:
            self.relay.offer(plan.version, plan.file, path)

    async def _chunk(
        self,
        plan: wire.FetchPlan,
        chunks: cm.ChunkHashes,
        index: int,
        source: wire.Source,
        clients: dict[str, ChunkClient],
        incoming: snap.IncomingFile,
    ) -> bytes | memoryview:
        """Chunk `index` from `source`, checked and written at its offset (the whole file's hash
        follows in `_download`): checked against its digest when it comes from a relay; from
        the consumer only its place and length (a wrong byte from the consumer fails the
        whole-file hash at the end, which ends the fetch just as a failed digest would)."""
        offset, size = chunks.span(index)
        msg = wire.FileChunkRequest(
            req=0, version=plan.version, file=plan.file, offset=offset, max_bytes=size
        )
        client = clients.get(source.endpoint)
        if client is None:
            client = clients[source.endpoint] = self._client(source)
        relay = source.endpoint != CONSUMER
        try:
            # a relay still fetching holds a request until it has the chunk: it is stalled
            # when it stays silent, to a probe too (chunk_client.py)
            reply = await client.chunk(
                msg, timeout_s=self.timeout_s, idle_s=self.relay_timeout_s if relay else None
            )
        except TimeoutError:
            if not relay:
                raise
            raise _BadChunk("stalled") from None
        except Rejected:
            if not relay:
                raise
            raise _BadChunk("refused") from None
        if reply.offset != offset or reply.version != plan.version:
            raise _BadChunk("wrong_reply")
        if len(reply.data) != size:
            raise _BadChunk("truncated")
        check = relay or self.relay is not None  # what is relayed onward is checked first
        if not await asyncio.to_thread(
            _check_and_write, chunks, index, reply.data, incoming, check
        ):
            raise _BadChunk("wrong_bytes")
        if self.relay is not None:
            self.relay.ready(plan.version, plan.file, index)
        return reply.data

    def _client(self, source: wire.Source) -> ChunkClient:
        """A client of the consumer's data socket ("") or of a relay (its own server key)."""
        keys, endpoint = self.keys, source.endpoint or self.data_endpoint
        if keys is not None and source.endpoint:
            keys = dataclasses.replace(keys, server_public=source.server_key.encode())
        return ChunkClient(self.ctx, endpoint, keys=keys, max_message_bytes=self.max_message_bytes)

    def _drop(
        self, source: wire.Source, reason: str, sources: list[wire.Source], outcome: Outcome
    ) -> None:
        if source in sources and source.endpoint != CONSUMER:
            sources.remove(source)
            outcome.bad_sources.append(wire.BadSource(source.endpoint, reason))
            self._count(f"bad_source.{reason}")
            log.warning(
                "relay %s dropped (%s): fetching from the next source", source.endpoint, reason
            )

    def _count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n


def _check_and_write(
    chunks: cm.ChunkHashes,
    index: int,
    data: bytes | memoryview,
    incoming: snap.IncomingFile,
    check: bool,
) -> bool:
    """Off the event loop (BLAKE3 and `pwrite` free the interpreter lock): False if `check`
    and `data` is not chunk `index`; else write it at its offset, True."""
    if check and not chunks.matches(index, data):
        return False
    incoming.write(chunks.span(index)[0], data)
    return True
