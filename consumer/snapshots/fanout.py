"""Who fetches a snapshot from whom: the consumer's side of the relayed, verified fan-out.

A producer that cannot read the consumer's snapshot from a shared filesystem asks over control
(`wire.FetchRequest`) and gets a `wire.FetchPlan`: which file (a delta when it holds exactly the
delta's base version, else the full weights), the file's per-chunk BLAKE3 digests (from the
snapshot's `chunks.json`, common/weights/chunk_manifest.py) and where to take the chunks. Sources
are a relay (a producer that serves this file, whole or as far as it has fetched it: `wire.Source`)
or the consumer itself; the consumer is always the last source of a plan, so a fetcher that drops a
bad relay finishes from it.

The copies form a tree of bounded fan-out: a source serves at most `max_children` fetchers of
one version at a time. A producer that relays becomes a source of the file the moment it is
given a plan for it: its relay serves each chunk as soon as it has checked it, and holds a
request for a chunk still on its way (producer/fetch/relay.py), so a chain of relays streams a
snapshot, each hop about one chunk behind the one above it. A request is given a relay with
room, else the consumer if it has room; among relays the least busy, a complete copy before one
still being fetched, and of those the deepest. With equal links this makes a chain: every new
fetcher hangs below the last (a relay with no fetcher yet), so the consumer sends one copy and
each link carries the file at full rate, while a second fetcher on one source would halve the
rate of everything below it; a branch, where one is needed, goes where it slows the fewest. A
relay still fetching takes fetchers only above `DEPTH_PER_CHUNK` hops per chunk of the file
(at least `MIN_DEPTH`), as each hop costs its fetchers about one chunk's transfer time.
When neither a relay nor the consumer has room and a relay-capable producer is still fetching
the file, the plan says `wait_s` and names no source; else the consumer serves beyond the bound
(nobody else ever will). A fetcher holds its slot until it reports (`wire.FetchDone`) or
`LEASE_S` passes; one that fails, asks anew or expires is no longer given out as a relay of
the file it was fetching. A version announced before its chunk hashes are written
(consumer/snapshots/fetch_files.py writes them just after the announcement) gets `wait_s` too.

Trust: the plan travels over the authenticated control channel; relays are untrusted producers.
A fetcher accepts a relay's chunk only if it hashes to the plan's digest, so a relay can slow a
fetch but never change its bytes. A reported bad source (`wrong_bytes`, `truncated`, `stalled`,
`refused`: `wire.BAD_SOURCE_REASONS`; any other reason is counted as `other`, so a peer cannot
name ledger counters) is counted (`fetch_bad_source.<reason>`), logged (rate-limited), and no
longer given out for that version; a source reported `MAX_BAD_REPORTS` times is never given out
again. (A hostile producer may report an honest relay: that costs the relay its children,
nothing else.)

Bounds: every record is per producer (its fetch in progress, where it relays) or per relay
endpoint (the holders of a file, its bad reports: kept only for endpoints a producer relays
from, so a report naming anything else changes nothing), and `forget(producer_id)` drops a
producer's records with it when the server forgets the producer (consumer/server/loop.py).

No sockets, no threads: the server calls `plan` and `done` on its network thread; the chunks
themselves are served by the data socket's thread (consumer/snapshots/dataplane.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import wire
from common.errors import SnapshotError, WireError
from common.net.log_limit import LogLimiter
from common.weights import chunk_manifest as cm
from common.weights import snapshot as snap

log = logging.getLogger("asyncgrpo.consumer")
CONSUMER = wire.Source("", "")
LEASE_S = 300.0  # a fetcher that never reports frees its slot after this long
WAIT_S = 0.1  # how long a fetcher waits before asking again when every source is busy
MAX_BAD_REPORTS = 3  # a source reported this often is never given out again
# A relay still fetching a file is given fetchers only above this depth (hops below a complete
# copy): DEPTH_PER_CHUNK per chunk of the file, at least MIN_DEPTH (see the module doc)
DEPTH_PER_CHUNK, MIN_DEPTH = 2, 4
_KEEP_VERSIONS = 8  # relay records and cached manifests of this many newest versions


@dataclass(slots=True)
class _Slot:
    key: tuple[int, str]  # (version, file)
    source: str  # endpoint; "" = the consumer
    since: float
    relay: str = ""  # where this fetcher serves the file while it fetches ("": nowhere)


@dataclass(slots=True)
class _Version:
    manifest: snap.Manifest
    chunks: cm.Chunks
    holders: dict[str, dict[str, wire.Source]] = field(default_factory=dict)  # file -> relays
    # (file, endpoint) -> hops below a complete copy, for relays still fetching the file
    depth: dict[tuple[str, str], int] = field(default_factory=dict)


class FanOut:
    def __init__(self, root: Path, *, max_children: int, count: Callable[[str, int], None]) -> None:
        self.root = root
        self.max_children = max(1, max_children)
        self._count = count
        self._versions: dict[int, _Version] = {}
        self._slots: dict[str, _Slot] = {}  # producer id -> its fetch in progress
        self._relays: dict[str, wire.Source] = {}  # producer id -> where it serves
        self._bad: Counter[str] = Counter()  # endpoint -> reports
        self._log = LogLimiter(log)

    # -- requests ------------------------------------------------------------------------------
    def plan(self, msg: wire.FetchRequest, now: float) -> wire.FetchPlan:
        """The plan for `msg` (`WireError("snapshot_gone")` if the version is not kept)."""
        self._expire(now)
        if msg.relay is not None and msg.relay.endpoint:
            self._relays[msg.producer_id] = msg.relay
        entry = self._version(msg.version)
        if entry is None:  # announced, its chunk hashes still being written: ask again soon
            self._count("fetch_waits", 1)
            return wire.FetchPlan(
                req=msg.req,
                version=msg.version,
                file="weights",
                base_version=-1,
                num_bytes=0,
                hash="",
                result_hash="",
                chunk_bytes=0,
                chunk_hashes=b"",
                sources=(),
                wait_s=WAIT_S,
            )
        m, c = entry.manifest, entry.chunks
        use_delta = c.delta_base >= 0 and msg.held_version == c.delta_base and "delta" in c.files
        file = "delta" if use_delta else "weights"
        chunks = c.files[file]
        digest = c.delta_hash if use_delta else m.hash
        base = c.delta_base if use_delta else -1
        self._end_slot(msg.producer_id, ok=False)  # a new request replaces an unfinished one
        source = self._choose(entry, (msg.version, file), msg.producer_id)
        if source is None:
            self._count("fetch_waits", 1)
            return _plan(msg, file, base, chunks, (digest, m.hash), sources=())
        slot = self._slots[msg.producer_id] = _Slot((msg.version, file), source.endpoint, now)
        relay = self._relays.get(msg.producer_id)
        if relay is not None and relay.endpoint not in entry.holders.get(file, {}):
            # it serves the chunks it has while it fetches the rest (producer/fetch/relay.py)
            entry.holders.setdefault(file, {})[relay.endpoint] = relay
            entry.depth[file, relay.endpoint] = entry.depth.get((file, source.endpoint), 0) + 1
            slot.relay = relay.endpoint
        self._count("fetch_from_relay" if source.endpoint else "fetch_from_consumer", 1)
        sources = (source, CONSUMER) if source.endpoint else (CONSUMER,)
        return _plan(msg, file, base, chunks, (digest, m.hash), sources=sources)

    def done(self, msg: wire.FetchDone) -> None:
        """A fetcher's report: free its slot, take note of bad sources, add a new relay."""
        self._end_slot(msg.producer_id, ok=msg.ok and msg.serving)
        self._count("fetch_ok" if msg.ok else "fetch_failed", 1)
        relays = {r.endpoint for r in self._relays.values()}
        first: dict[str, str] = {}  # one report per endpoint and message: its first reason
        for bad in msg.bad_sources:
            first.setdefault(bad.endpoint, bad.reason)
        for endpoint, why in first.items():
            reason = why if why in wire.BAD_SOURCE_REASONS else "other"
            self._count(f"fetch_bad_source.{reason}", 1)
            if endpoint not in relays:  # no relay of ours: nothing to withhold, nothing kept
                continue
            self._bad[endpoint] += 1
            self._log.log(
                f"bad_source.{reason}",
                logging.WARNING,
                "relay %s reported by %s for v%d: %s (%d reports)",
                endpoint[:100],
                msg.producer_id,
                msg.version,
                reason,
                self._bad[endpoint],
            )
            self._drop_holder(endpoint)
        relay = self._relays.get(msg.producer_id)
        entry = self._versions.get(msg.version)
        if msg.ok and msg.serving and relay is not None and entry is not None:
            files = ("weights", "delta") if msg.file == "delta" else ("weights",)
            for file in files:
                entry.holders.setdefault(file, {})[relay.endpoint] = relay
                entry.depth.pop((file, relay.endpoint), None)  # complete: serves at once

    def forget(self, producer_id: str) -> None:
        """Drop `producer_id`'s records: its fetch in progress, its relay, and what is kept of
        its relay's endpoint (unless another producer relays from it)."""
        self._end_slot(producer_id, ok=False)
        relay = self._relays.pop(producer_id, None)
        if relay is None or any(r.endpoint == relay.endpoint for r in self._relays.values()):
            return
        self._bad.pop(relay.endpoint, None)
        self._drop_holder(relay.endpoint)

    def _drop_holder(self, endpoint: str) -> None:
        for held in self._versions.values():
            for file, holders in held.holders.items():
                holders.pop(endpoint, None)
                held.depth.pop((file, endpoint), None)

    def _end_slot(self, producer_id: str, *, ok: bool) -> None:
        """Free `producer_id`'s slot; unless `ok`, it no longer relays the file it was fetching
        (a fetch that failed, was replaced or expired)."""
        slot = self._slots.pop(producer_id, None)
        if slot is None or not slot.relay or ok:
            return
        entry = self._versions.get(slot.key[0])
        file = slot.key[1]
        if entry is not None and entry.depth.pop((file, slot.relay), None) is not None:
            entry.holders.get(file, {}).pop(slot.relay, None)

    # -- state ---------------------------------------------------------------------------------
    def _version(self, version: int) -> _Version | None:
        """What is known of `version`; None while its chunk manifest is not written yet."""
        known = self._versions.get(version)
        if known is not None:
            return known
        directory = snap.snapshot_dir(self.root, version)
        try:
            manifest = snap.read_manifest(directory)
        except SnapshotError:
            raise WireError("snapshot_gone", f"version {version} is no longer kept") from None
        chunks = cm.read_chunks(directory)
        if chunks is None:
            return None
        if "weights" not in chunks.files or not all(c.consistent() for c in chunks.files.values()):
            raise WireError("snapshot_gone", f"version {version} has an unusable chunk manifest")
        entry = self._versions[version] = _Version(manifest, chunks)
        for old in sorted(self._versions)[:-_KEEP_VERSIONS]:
            del self._versions[old]
        return entry

    def _choose(
        self, entry: _Version, key: tuple[int, str], producer_id: str
    ) -> wire.Source | None:
        load = Counter(s.source for s in self._slots.values() if s.key == key)
        own = self._relays.get(producer_id)
        file = key[1]
        max_depth = max(MIN_DEPTH, DEPTH_PER_CHUNK * entry.chunks.files[file].num_chunks)
        free = [
            r
            for r in entry.holders.get(file, {}).values()
            if load[r.endpoint] < self.max_children
            and self._bad[r.endpoint] < MAX_BAD_REPORTS
            and (own is None or r.endpoint != own.endpoint)
            and entry.depth.get((file, r.endpoint), 0) < max_depth
        ]
        if free:  # the least busy; a complete copy first; else the deepest (see the module doc)
            return min(free, key=lambda r: _rank(load[r.endpoint], entry.depth, file, r.endpoint))
        if load[""] < self.max_children:
            return CONSUMER
        coming = any(
            s.key == key and self._relays.get(p) is not None for p, s in self._slots.items()
        )
        return None if coming else CONSUMER

    def _expire(self, now: float) -> None:
        for producer_id, slot in list(self._slots.items()):
            if now - slot.since > LEASE_S:
                self._end_slot(producer_id, ok=False)
                self._count("fetch_expired", 1)


def _rank(
    load: int, depth: dict[tuple[str, str], int], file: str, endpoint: str
) -> tuple[int, ...]:
    """A relay's rank as a source (lowest first): its fetchers now; a complete copy before one
    still being fetched; the deepest of those (a branch there slows the fewest fetchers)."""
    hops = depth.get((file, endpoint), 0)
    return (load, 1 if hops else 0, -hops)


def _plan(
    msg: wire.FetchRequest,
    file: str,
    base: int,
    chunks: cm.ChunkHashes,
    hashes: tuple[str, str],
    *,
    sources: tuple[wire.Source, ...],
) -> wire.FetchPlan:
    """The plan to fetch `file` of `msg`'s version (`hashes`: the file's and, once applied, the
    weights'), from `sources`; none: a plan to ask again after `WAIT_S` (no chunk hashes)."""
    return wire.FetchPlan(
        req=msg.req,
        version=msg.version,
        file=file,
        base_version=base,
        num_bytes=chunks.num_bytes,
        hash=hashes[0],
        result_hash=hashes[1],
        chunk_bytes=chunks.chunk_bytes,
        chunk_hashes=chunks.hashes if sources else b"",
        sources=sources,
        wait_s=0.0 if sources else WAIT_S,
    )
