"""The network thread's files in the run directory: leases.jsonl, ledger.json and (through
consumer/server/roster.py) the producers' files, written as common/files/run_files.py's records.

Nothing the network thread does here grows with the number of producers:
- a settled step hands its finished leases to the writer thread for leases.jsonl
  (`append_finished`: the cost of a call is the leases it hands over), so the network thread
  never waits on the disk; a checkpoint's size of leases.jsonl is the writer's, after the
  flush that went with its book's state, so the two match;
- ledger.json (counts, per producer, the host of every producer that held a lease) and the
  producers' files are rewritten at most every `_BOOKS_EVERY_S` (`maybe_write`), and at once by
  `flush` (`Server.flush_ledger`, `Server.checkpoint_state`, the end of the thread), on the
  writer thread (consumer/server/book_writer.py). The network thread hands it what changed
  since the last hand-over: the producers' statuses noted as they changed (a dict swap) and the
  counts of the producers whose leases moved (`LeaseBook.take_changed`), and a copy of the
  loop's timing for netstats.json (common/files/net_stats.py).
ledger.json is replaced atomically: readers see the old file or the new one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from common.files.net_stats import NetStats
from consumer.server.book_writer import BookChanges, BookWriter, LedgerChanges
from consumer.server.roster import Census
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
        self._due = 0.0  # monotonic time the files may be rewritten again
        self._ledger_written = False  # ledger.json: written once at least
        self.writer = BookWriter(run_dir)

    @property
    def census(self) -> Census:
        """The producers by state as of the last write of the producers' files."""
        return self.writer.roster.census

    def append_finished(self) -> None:
        """Hand the leases finished since the last call to the writer thread for leases.jsonl
        (incremental: the cost of a call is the leases it hands over)."""
        finished = tuple(self._state.book.take_finished())
        if finished:
            self.writer.submit(BookChanges({}, None, None, finished))

    def flush(self) -> Future[int]:
        """Every file, on the writer thread: leases.jsonl, ledger.json, the producers' files
        (the future completes when they are written, with the size of leases.jsonl)."""
        return self._hand_over(ledger=True)

    def written(self) -> Future[int]:
        """Done once everything handed over so far is written (nothing new is handed over)."""
        return self.writer.submit(BookChanges({}, None, None))

    def maybe_write(self, now: float) -> None:
        """Hand the writer what changed if `_BOOKS_EVERY_S` passed since the last hand-over
        (ledger.json only if it is behind). A failed write of an earlier hand-over is raised."""
        if self.writer.error is not None:
            raise RuntimeError("writing the run's books failed") from self.writer.error
        st = self._state
        behind = st.book.changed or not self._ledger_written  # ledger.json
        if now >= self._due and (behind or st.roster_changes):
            self._hand_over(ledger=behind)
            self._due = now + _BOOKS_EVERY_S

    def close(self) -> None:
        """Finish the writes handed over; end the writer thread."""
        self.writer.close()

    def _hand_over(self, *, ledger: bool) -> Future[int]:
        st = self._state
        roster = st.take_roster_changes()
        stats = NetStats.of(
            st.timing, unix_time=time.time(), groups_trained=st.book.counts["trained"]
        )
        finished = tuple(st.book.take_finished())
        changes = self._ledger_changes() if ledger else None
        return self.writer.submit(BookChanges(roster, changes, stats, finished))

    def _ledger_changes(self) -> LedgerChanges:
        st = self._state
        changed = st.book.take_changed()
        self._ledger_written = True
        return LedgerChanges(
            totals=st.book.totals(),
            by_producer=changed,
            hosts={p: st.hosts.get(p, "") for p in changed},
            counters=self._counters_now(),
            admission=st.admission.run_summary(),
            policy_version=st.policy_version,
        )

    def _counters_now(self) -> dict[str, int]:
        """The server's counters, with the key gate's refusals as `rejected.unknown_key`."""
        with self._state.lock:
            counters = dict(self._state.counters)
        refused = self._refused_keys() if self._refused_keys is not None else 0
        if refused:
            counters["rejected.unknown_key"] = refused
        return counters
