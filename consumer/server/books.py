"""The network thread's files in the run directory: leases.jsonl, ledger.json and (through
consumer/server/roster.py) the producers' files, written as common/run_files.py's records.

Nothing per step grows with the number of producers: a settled step appends its finished leases
to leases.jsonl (`append_finished`: the cost of a call is the leases it writes); ledger.json
(counts, per producer, the host of every producer that held a lease) and the producers' files
are rewritten by the loop's housekeeping at most every `_BOOKS_EVERY_S` (`maybe_write`), and at
once by `flush` (`Server.flush_ledger`, `Server.checkpoint_state`, the end of the thread).
ledger.json is replaced atomically: readers see the old file or the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from common import run_files as RF
from consumer.server.roster import Roster
from consumer.server.state import NetState

_BOOKS_EVERY_S = 2.0  # ledger.json and the producers' files: rewritten at most this often


class Books:
    """Writes the lease book's files of `run_dir` from `state`; `refused_keys` counts the
    CurveZMQ connections the key gates refused (consumer/key_gate.py: control's and the data
    socket's), if there are any."""

    def __init__(
        self, state: NetState, run_dir: Path, *, refused_keys: Callable[[], int] | None
    ) -> None:
        self._state, self.run_dir = state, run_dir
        self._refused_keys = refused_keys
        self._due = 0.0  # monotonic time ledger.json may be rewritten again
        self.roster = Roster(run_dir, every_s=_BOOKS_EVERY_S)

    def append_finished(self) -> None:
        """Append the leases finished since the last call to leases.jsonl (incremental: the
        cost of a call is the leases it writes)."""
        RF.append_leases(self.run_dir, self._state.book.take_finished())

    def flush_ledger(self) -> None:
        """Append finished leases to leases.jsonl and rewrite ledger.json (atomically)."""
        self.append_finished()
        st = self._state
        ledger = RF.Ledger(
            balance=st.book.balance(),
            by_producer={p: dict(c) for p, c in st.book.by_producer.items()},
            hosts={p: st.hosts.get(p, "") for p in st.book.by_producer},
            counters=self._counters_now(),
            admission=st.admission.run_summary(),
            policy_version=st.policy_version,
        )
        RF.write_ledger(self.run_dir, ledger)
        st.ledger_dirty = False

    def flush(self) -> None:
        """Every file now: leases.jsonl, ledger.json and the producers' files."""
        self.flush_ledger()
        self.roster.write(self._state.producers)

    def maybe_write(self, now: float) -> None:
        """ledger.json if it is behind and was not rewritten in the last `_BOOKS_EVERY_S`; the
        producers' files on their own clock (consumer/server/roster.py)."""
        if self._state.ledger_dirty and now >= self._due:
            self.flush_ledger()
            self._due = now + _BOOKS_EVERY_S
        self.roster.maybe_write(self._state.producers, now)

    def _counters_now(self) -> dict[str, int]:
        """The server's counters, with the key gate's refusals as `rejected.unknown_key`."""
        counters = dict(self._state.counters)
        refused = self._refused_keys() if self._refused_keys is not None else 0
        if refused:
            counters["rejected.unknown_key"] = refused
        return counters
