"""The run directory's files: their names, and one typed record for each file that one process
writes and another reads.

Writers and readers go through here; nobody builds or indexes these files' JSON by hand. A
record's `to_json()` is the object written, key for key as the consumer has always written it
(older runs stay readable, newer files read by older code stay the same); `from_json()` reads
one back, filling what older runs lack with the field's default and ignoring keys it does not
know (a newer writer). Who writes what:

- `config.toml` (`CONFIG`): the resolved config (launch/cli/, the consumer).
- `metrics.jsonl` (`METRICS`): one `common.files.metrics.StepRecord` per optimizer step (the
  learner).
- `leases.jsonl` (`LEASES`): one `LeaseLine` per finished lease, appended when it ends
  (consumer/server/books.py).
- `ledger.json` (`LEDGER`): the lease book's `Ledger`, replaced atomically (books.py).
- `producers.json` (`PRODUCERS`): `ProducersFile`, the newest `ProducerStatus` of every producer
  the consumer knows; `producers.jsonl` (`PRODUCER_HISTORY`): one `ProducerChange` each time a
  producer's loaded weight version or state changed (consumer/server/roster.py). Runs older than
  these files kept each producer's view in every metrics line: `latest_producers` reads either.
- `endpoints.json` (`ENDPOINTS`): `Endpoints`, the consumer's bound sockets, written once all are
  bound (so its presence means they are live).
- `consumer.json` (`CONSUMER`): the consumer serving the run (host, pid, start), written when it
  listens (its record: common/files/run_state.py).
- `netstats.json`: the network thread timed from inside (common/files/net_stats.py), rewritten with
  the books.
- `final.json` (`FINAL`) and `signal.json` (`SIGNAL`): how the run ended, and whether its groups
  carry a learning signal (their records: common/files/run_state.py).
- `eval.json`, `summary.md`, `plots/`, `processes.json`, `*.log`: the evaluator's, the report's
  and the launcher's outputs.
- `snapshots/`, `checkpoints/` (`checkpoint/` in older runs): weights out and resume state; a
  checkpoint's `BookState` holds the lease book and the sizes of the append-only logs.

`StepSummary` is not a file: it is what the network thread hands the learner for each metrics
line (counts in total, never per producer).

Units: times in seconds (`unix_time`: the wall clock; `issued_at`: the consumer's monotonic
clock), sizes in bytes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from common.files.disk import append_text, replace_text
from common.files.json_text import dumps_sorted
from common.files.metrics import StepRecord, read_jsonl

# -- names ------------------------------------------------------------------------------------
CONFIG = "config.toml"
METRICS = "metrics.jsonl"
LEASES = "leases.jsonl"
LEDGER = "ledger.json"
PRODUCERS = "producers.json"
PRODUCER_HISTORY = "producers.jsonl"
ENDPOINTS = "endpoints.json"
FINAL = "final.json"
SIGNAL = "signal.json"
CONSUMER = "consumer.json"
EVAL = "eval.json"
SUMMARY = "summary.md"
PROCESSES = "processes.json"
SNAPSHOTS = "snapshots"
CHECKPOINTS = "checkpoints"
STREAM = "stream"  # the recorded stream (consumer/stream/)
LEGACY_CHECKPOINT = "checkpoint"  # the layout before checkpoints/LATEST
PLOTS = "plots"
CONSUMER_LOG = "consumer.log"
CONSUMER_STDOUT_LOG = "consumer.stdout.log"  # the launcher's capture of the consumer's output


def log_name(process: str) -> str:
    """The log file a process started by the CLI writes into the run directory."""
    return f"{process}.log"


def _known(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of `data` that name a field of the dataclass `cls` (a newer writer's extra
    keys are ignored); a missing field without a default is a `ValueError` naming it."""
    fields = dataclasses.fields(cls)
    required = {f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING}
    absent = required - data.keys()
    if absent:
        raise ValueError(f"{cls.__name__} lacks {', '.join(sorted(absent))}")
    names = {f.name for f in fields}
    return {k: v for k, v in data.items() if k in names}


class _Record:
    """A record whose JSON object is its fields in order, those that are None left out."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {f.name: v for f in fields if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(**_known(cls, data))


def _replace_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never a part."""
    replace_text(path, text)


def _append_lines(path: Path, records: Iterable[_Record]) -> None:
    append_text(path, "".join(json.dumps(r.to_json()) + "\n" for r in records))


# -- leases.jsonl -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseLine(_Record):
    """One finished lease (consumer/server/leases.py says what the states mean)."""

    lease_id: int  # incarnation << 40 | n
    prompt_index: int
    step: int  # the optimizer step it was granted for
    min_version: int  # oldest weights it could be sampled with
    producer_id: str
    issued_at: float  # the consumer's monotonic clock, seconds
    state: str  # its final state: one of common.wire.OUTCOMES
    behavior_version: int = -1  # weights it was sampled with (-1: never delivered)
    trained_step: int = -1  # the step that trained it (-1: not trained)
    num_tokens: int = 0
    reason: str = ""  # why it expired ("timeout", "not held", "shutdown", ...)

    @property
    def staleness(self) -> int:
        """learner version - behaviour version, of a trained lease."""
        return self.trained_step - self.behavior_version


def append_leases(run_dir: Path, lines: Iterable[LeaseLine]) -> None:
    """Append finished leases to `leases.jsonl`, one JSON object a line."""
    _append_lines(run_dir / LEASES, lines)


def read_leases(run_dir: Path) -> list[LeaseLine]:
    """`leases.jsonl`, oldest first ([] before the first lease ended; a torn last line is
    skipped)."""
    path = run_dir / LEASES
    return [LeaseLine.from_json(d) for d in read_jsonl(path)] if path.exists() else []


# -- ledger.json ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Balance(_Record):
    """The lease book's counts by state: leases `issued`, one count per final state (the fields
    between `issued` and `open` are common.wire.OUTCOMES, in order), leases still `open`, and
    `ok`: whether issued == sum(final) + open, in total and per producer (None where it was not
    checked: the per-step totals). Written with `ok` as 1 or 0."""

    issued: int = 0
    trained: int = 0
    dropped_stale: int = 0
    dropped_zero_variance: int = 0
    rejected_invalid: int = 0
    expired: int = 0
    open: int = 0
    ok: bool | None = None

    def final(self, outcome: str) -> int:
        """The count of one final state (`outcome` in common.wire.OUTCOMES)."""
        assert outcome in FINAL_STATES, outcome
        return int(getattr(self, outcome))

    def to_json(self) -> dict[str, Any]:
        out = _Record.to_json(self)
        return out if self.ok is None else {**out, "ok": int(self.ok)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        known = _known(cls, data)
        return cls(**{**known, "ok": bool(known["ok"])} if "ok" in known else known)


# common.wire.OUTCOMES, in order (tests/unit/test_run_files.py checks: this module does not import
# the wire, so that the CLI starts without numpy)
FINAL_STATES = tuple(f.name for f in dataclasses.fields(Balance))[1:-2]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backpressure(_Record):
    """The learner's queue at the end of a step (consumer/server/admission.py): admitted groups
    and their encoded bytes now, the most at once since the previous step, groups producers hold
    for the consumer now, times they were told to hold one so far, and how long a held group
    waited (told to hold -> admitted, over those admitted so far). Keys of a metrics line."""

    queued_groups: int
    queued_bytes: int
    queued_groups_peak: int
    queued_bytes_peak: int
    groups_held: int
    holds: int
    hold_s_mean: float
    hold_s_max: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BackpressureTotals(_Record):
    """`Backpressure` over the whole run (ledger.json's `admission`), with the whole run's peaks
    (`queued_bytes_max`, `queued_groups_max`) in place of those since the previous step. A field
    is None where a run older than it did not write it."""

    queued_groups: int | None = None
    queued_bytes: int | None = None
    groups_held: int | None = None
    holds: int | None = None
    hold_s_mean: float | None = None
    hold_s_max: float | None = None
    queued_bytes_max: int | None = None
    queued_groups_max: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ledger:
    """`ledger.json`: the lease book's counts in total (`balance`) and per producer
    (`by_producer`: {producer: {"issued" | an outcome | "taken_over" | "handed_over": count}},
    zero counts left out), the host each producer that held a lease registered from, the
    network thread's counters (`rejected.<reason>`: messages and connections refused), the
    backpressure over the run (absent from older runs), and the policy version at the write."""

    balance: Balance
    by_producer: dict[str, dict[str, int]] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    admission: BackpressureTotals | None = None
    policy_version: int | None = None

    def count(self, producer: str, state: str) -> int:
        """Leases of `producer` counted under `state` (0 for a producer it does not know)."""
        return int(self.by_producer.get(producer, {}).get(state, 0))

    def held(self, producer: str) -> int:
        """Leases `producer` held: issued to it, plus taken over from others, minus handed over
        (checkpoints of a consumer that moved leases carry the last two)."""
        taken, handed = self.count(producer, "taken_over"), self.count(producer, "handed_over")
        return self.count(producer, "issued") + taken - handed

    def refused(self) -> dict[str, int]:
        """The counters of refused messages and connections (`rejected.<reason>`)."""
        return {k: v for k, v in self.counters.items() if k.startswith("rejected.")}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "balance": self.balance.to_json(),
            "by_producer": self.by_producer,
            "hosts": self.hosts,
            "counters": self.counters,
        }
        if self.admission is not None:
            out["admission"] = self.admission.to_json()
        if self.policy_version is not None:
            out["policy_version"] = self.policy_version
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        known = _known(cls, {"balance": {}, **data})
        known["balance"] = Balance.from_json(known["balance"])
        if known.get("admission") is not None:
            known["admission"] = BackpressureTotals.from_json(known["admission"])
        return cls(**known)


def write_ledger(run_dir: Path, ledger: Ledger) -> None:
    """Replace `ledger.json` atomically (indented, keys sorted)."""
    _replace_atomically(run_dir / LEDGER, json.dumps(ledger.to_json(), indent=1, sort_keys=True))


def read_ledger(run_dir: Path) -> Ledger:
    """`ledger.json`; `OSError` when there is none, `ValueError` when it is not a ledger."""
    data = json.loads((run_dir / LEDGER).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{run_dir / LEDGER} is not a JSON object")
    return Ledger.from_json(data)


def latest_ledger(run_dir: Path) -> Ledger | None:
    """`ledger.json` while a run may be writing it: None before the first write, or if it is
    unreadable."""
    try:
        return read_ledger(run_dir)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary:
    """What the network thread hands the learner for one metrics line, its size independent of
    the number of producers: the ledger's counts in total (`totals`, `ok` unchecked), messages
    refused so far, the producers live (neither gone nor left) and by state as of the last
    write of producers.json, and the backpressure since the previous summary."""

    totals: Balance
    rejected_messages: int
    producers_live: int
    producers_by_state: dict[str, int]
    backpressure: Backpressure


# -- producers.json, producers.jsonl ----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerStatus(_Record):
    """What the consumer last knew of one producer: its loaded weight `version`, its `state`
    ("registered", "ready", "generating", "gone", "left", ...), where it runs, the leases it
    holds and its last heartbeat's counters (producer/: counts, and seconds for `*_s`). Runs
    older than producers.json recorded only `version`, `state` and the counters."""

    version: int
    state: str
    host: str = ""
    pid: int = 0
    engine: str = ""
    num_in_flight: int = 0
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def reward_errors(self) -> int:
        """Reward calls that raised (scored 0) since the producer started."""
        return int(self.counters.get("reward_errors", 0))

    @property
    def reward_timeouts(self) -> int:
        """Reward calls that timed out (scored 0) since the producer started."""
        return int(self.counters.get("reward_timeouts", 0))

    @property
    def groups_sent(self) -> int:
        return int(self.counters.get("groups_sent", 0))

    @property
    def busy_s(self) -> float:
        """Seconds with at least one lease generating or scoring."""
        return float(self.counters.get("busy_s", 0.0))

    @property
    def uptime_s(self) -> float:
        return float(self.counters.get("uptime_s", 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducersFile:
    """`producers.json`: every producer's newest status, written at `unix_time`."""

    unix_time: float
    producers: dict[str, ProducerStatus]

    def to_json(self) -> dict[str, Any]:
        producers = {p: s.to_json() for p, s in self.producers.items()}
        return {"unix_time": self.unix_time, "producers": producers}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        known = _known(cls, data)
        producers = {p: ProducerStatus.from_json(s) for p, s in known["producers"].items()}
        return cls(unix_time=float(known["unix_time"]), producers=producers)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerChange(_Record):
    """One line of `producers.jsonl`: `producer` had loaded `version` and was in `state` at
    `unix_time`."""

    unix_time: float
    producer: str
    version: int
    state: str


def write_producers(run_dir: Path, current: ProducersFile) -> None:
    """Replace `producers.json` atomically (keys sorted; encoded a producer at a time)."""
    _replace_atomically(run_dir / PRODUCERS, dumps_sorted(current.to_json(), depth=2))


def append_producer_changes(run_dir: Path, changes: Iterable[ProducerChange]) -> None:
    _append_lines(run_dir / PRODUCER_HISTORY, changes)


def read_producers(run_dir: Path) -> dict[str, ProducerStatus]:
    """`producers.json`'s producers ({} before the first write, or if it is unreadable)."""
    try:
        return ProducersFile.from_json(json.loads((run_dir / PRODUCERS).read_text())).producers
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def read_producer_history(run_dir: Path) -> list[ProducerChange]:
    """`producers.jsonl`'s lines, oldest first ([] before the first write)."""
    path = run_dir / PRODUCER_HISTORY
    return [ProducerChange.from_json(d) for d in read_jsonl(path)] if path.exists() else []


def latest_producers(run_dir: Path, last: StepRecord | None = None) -> dict[str, ProducerStatus]:
    """Every producer's newest status: `producers.json`, or, in a run older than that file, the
    per-producer fields of its last metrics line `last`."""
    current = read_producers(run_dir)
    return current if current or last is None else producers_of_line(last)


def producers_of_line(record: StepRecord) -> dict[str, ProducerStatus]:
    """The producers a metrics line of a run older than producers.json carried ({} in newer
    runs: their lines hold aggregates only)."""
    counters = record.producer_counters or {}
    return {
        p: ProducerStatus.from_json({**v, "counters": counters.get(p, {})})
        for p, v in (record.producers or {}).items()
    }


# -- endpoints.json ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoints(_Record):
    """The consumer's bound sockets as `tcp://host:port`. A consumer writes all four (`data`,
    the snapshot data plane, is absent from older runs); a producer needs only `control`."""

    control: str
    rollouts: str | None = None
    announce: str | None = None
    data: str | None = None

    def ports(self) -> dict[str, int]:
        """{socket: port} of the sockets this file names."""
        return {k: int(v.rsplit(":", 1)[1]) for k, v in self.to_json().items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """`ValueError` naming what is wrong (no control socket, an endpoint not a string)."""
        known = _known(cls, data)
        for name, value in known.items():
            if not isinstance(value, str):
                raise ValueError(f"its {name!r} is not a string")
        return cls(**known)


def write_endpoints(run_dir: Path, endpoints: Endpoints) -> None:
    """Write `endpoints.json` whole or not at all: producers may be waiting for it."""
    _replace_atomically(run_dir / ENDPOINTS, json.dumps(endpoints.to_json()))


def read_endpoints(path: Path) -> Endpoints:
    """An `endpoints.json` (`path`: the file, which producers may be given under any name);
    `OSError` when it cannot be read, `ValueError` when it is not a consumer's."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    return Endpoints.from_json(data)


# -- a checkpoint's book ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class BookState:
    """The network thread's part of a checkpoint (its `state.json`'s "book"): the lease book's
    own state (consumer/server/leases.py `LeaseBook.state_dict`, opaque here), the producers'
    identities (consumer/server/identity.py), and the sizes in bytes of the run directory's
    append-only logs when it was taken, so a resumed run truncates them to exactly that state."""

    book: dict[str, Any]
    identities: dict[str, Any] = field(default_factory=dict)
    log_sizes: dict[str, int] = field(default_factory=dict)  # {file name: bytes}

    def to_json(self) -> dict[str, Any]:
        return {**self.book, "identities": self.identities, "logs": self.log_sizes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        book = {k: v for k, v in data.items() if k not in ("identities", "logs")}
        identities, logs = dict(data.get("identities", {})), dict(data.get("logs", {}))
        return cls(book=book, identities=identities, log_sizes=logs)
