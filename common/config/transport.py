"""How weights and groups travel: snapshot files and their distribution; sockets and limits."""

from __future__ import annotations

from dataclasses import dataclass

from common.config.fields import SnapshotDtype, SnapshotFsync, _f, failed
from common.net.endpoints import endpoint_host, endpoint_problem, is_loopback


@dataclass(frozen=True, slots=True)
class SnapshotConfig:
    """`[snapshot]`: snapshot files and how producers fetch them."""

    dtype: SnapshotDtype = _f("bfloat16", "Snapshot weight dtype.")
    keep_last: int = _f(3, "Snapshots kept on disk (older ones are deleted).")
    chunk_mib: float = _f(
        4.0,
        "Chunk size (and per-chunk hash) when producers fetch snapshots over the network "
        "(served on the data socket, never ahead of a control request).",
    )
    anchor_every: int = _f(
        10,
        "Versions between full anchors; the versions between carry a sparse delta on the previous "
        "one, which network fetchers holding it download instead (0 = no deltas).",
    )
    fanout: int = _f(
        4,
        "Most fetchers one source (the consumer or a relaying producer) serves a version to at "
        "once, while relays are available: the fan-out of the copy tree.",
    )
    delta_max_ratio: float = _f(
        0.5, "A version whose delta would exceed this fraction of the full file is an anchor."
    )
    delay_s: float = _f(
        0.0, "Stress testing: hold each snapshot back this long before announcing it."
    )
    fsync: SnapshotFsync = _f(
        "before_announce",
        "fsync of snapshot files, directory and parent: before announcing, after (producers "
        "load from the page cache meanwhile), or off; a torn file is refused by its hash.",
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        return failed(
            (self.keep_last >= 1, "snapshot.keep_last must be >= 1"),
            (self.fanout >= 1, "snapshot.fanout must be >= 1"),
            (self.anchor_every >= 0, "snapshot.anchor_every must be >= 0"),
            (0 < self.delta_max_ratio <= 1, "snapshot.delta_max_ratio must be in (0, 1]"),
        )


@dataclass(frozen=True, slots=True)
class NetConfig:
    """`[net]`: addresses, ports, keys, message and queue limits, timeouts."""

    bind_host: str = _f(
        "127.0.0.1", "Consumer bind address; non-loopback needs keys_dir or insecure."
    )
    advertise_host: str = _f(
        "",
        "Consumer: the host endpoints.json names for producers (net.connect_file); empty = "
        "net.bind_host, or this host's name when bound to every interface (0.0.0.0, ::).",
    )
    control_port: int = _f(
        5555, "Control (ROUTER) port; 0 = pick a free one (written to endpoints.json)."
    )
    rollouts_port: int = _f(0, "Rollouts (PULL) port; 0 = pick a free one.")
    announce_port: int = _f(0, "Announce (PUB) port; 0 = pick a free one.")
    data_port: int = _f(0, "Data (ROUTER: snapshot chunks) port; 0 = pick a free one.")
    connect: str = _f("tcp://127.0.0.1:5555", "Producer: the consumer's control endpoint.")
    connect_file: str = _f(
        "",
        "Producer: wait for this endpoints.json (a consumer writes it in its run directory once "
        "bound) and connect to its control endpoint instead of net.connect.",
    )
    keys_dir: str = _f("", "CurveZMQ keys (asyncgrpo keys DIR); empty = no encryption.")
    insecure: bool = _f(False, "Allow a non-loopback bind or connect without CurveZMQ.")
    max_message_mib: float = _f(
        64.0, "Largest accepted message (ZMQ_MAXMSGSIZE and unpacker limits)."
    )
    heartbeat_s: float = _f(
        1.0,
        "Shortest producer heartbeat period; the consumer lengthens it to keep heartbeats within "
        "net.max_heartbeats_per_s and tells producers in every reply.",
    )
    max_heartbeats_per_s: float = _f(
        64.0,
        "Consumer: heartbeats per second it asks of all live producers together: the period "
        "it sends is max(net.heartbeat_s, live producers / this), and its producer timeout and "
        "the producers' consumer timeout stretch with it.",
    )
    producer_timeout_s: float = _f(
        30.0,
        "A producer silent this long is gone; its leases expire (at least three heartbeat "
        "periods as the consumer sends them).",
    )
    lease_timeout_s: float = _f(
        900.0, "A lease not delivered in this time expires and is re-issued."
    )
    lease_wait_s: float = _f(
        2.0,
        "Longest a lease request that cannot be granted waits at the consumer; it is answered "
        "the moment leases free up (0 = answer at once, empty). With more producers than "
        "net.max_heartbeats_per_s allows at net.heartbeat_s, producers ask to wait four "
        "heartbeat periods instead (at most 600 s).",
    )
    resend_after_s: float = _f(
        60.0,
        "Producer re-sends a group not acknowledged in this time (at least three heartbeat "
        "periods as the consumer sends them).",
    )
    max_queued_mib: float = _f(
        256.0,
        "Consumer: groups received and waiting for the learner take at most this many MiB "
        "(encoded); beyond it producers hold their finished groups until told there is room. "
        "At least net.max_message_mib.",
    )
    max_queued_groups: int = _f(
        1024, "Consumer: at most this many groups wait for the learner (as net.max_queued_mib)."
    )
    handshake_timeout_s: float = _f(60.0, "How long a producer waits for the consumer's welcome.")
    consumer_timeout_s: float = _f(
        300.0,
        "A producer that hears nothing from the consumer this long exits (0 = waits for ever; "
        "at least three heartbeat periods as the consumer sends them).",
    )

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key): ranges, the endpoint's
        form, and traffic beyond this machine only with CurveZMQ keys or `insecure`."""
        bad_endpoint = endpoint_problem(self.connect)
        secure = bool(self.keys_dir) or self.insecure
        return failed(
            (
                self.heartbeat_s > 0 and self.producer_timeout_s > 2 * self.heartbeat_s,
                "net.producer_timeout_s must exceed two heartbeats (net.heartbeat_s)",
            ),
            (self.max_heartbeats_per_s > 0, "net.max_heartbeats_per_s must be > 0"),
            (self.max_message_mib > 0, "net.max_message_mib must be > 0"),
            (
                self.max_queued_mib >= self.max_message_mib,
                f"net.max_queued_mib = {self.max_queued_mib:g} < net.max_message_mib = "
                f"{self.max_message_mib:g}: the largest group could never be admitted; raise it",
            ),
            (self.max_queued_groups >= 1, "net.max_queued_groups must be >= 1"),
            (
                0 <= self.lease_wait_s <= 5,
                "net.lease_wait_s must be in [0, 5] (a producer gives up on a request after 10 s)",
            ),
            (
                self.consumer_timeout_s == 0 or self.consumer_timeout_s > 2 * self.heartbeat_s,
                "net.consumer_timeout_s must be 0 (wait for ever) or exceed two heartbeats",
            ),
            (not bad_endpoint, f"net.connect = {self.connect!r}: {bad_endpoint}"),
            (
                secure or is_loopback(self.bind_host),
                f"net.bind_host = {self.bind_host!r} is not a loopback address: "
                "traffic beyond this machine must be encrypted; "
                "create keys with `asyncgrpo keys DIR` and set net.keys_dir, or "
                "set net.insecure = true to send it unencrypted",
            ),
            (
                secure or is_loopback(endpoint_host(self.connect)),
                f"net.connect = {self.connect!r} leaves this machine: "
                "set net.keys_dir (CurveZMQ keys: `asyncgrpo keys DIR`), or net.insecure = true "
                "to send it unencrypted",
            ),
        )
