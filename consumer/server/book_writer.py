"""The books' writer thread ("consumer-books"): leases.jsonl, ledger.json and the producers'
files (consumer/server/roster.py), serialised and written off the network thread, which thus
never waits on the disk: a disk that stalls for seconds stalls this thread, while heartbeats
and lease requests are answered.

The network thread hands over `BookChanges`, what changed since its last hand-over, taken in
time proportional to the changes (consumer/server/books.py); this thread keeps the whole picture
(each producer's counts, open leases and host; each producer's status), applies the changes in
the order they were handed over and writes the files in common/files/run_files.py's formats, and the
network thread's timing to netstats.json (common/files/net_stats.py). The JSON
encoding of every producer, the cost that grows with the number of producers, is paid here.

Invariants:
- Changes are applied in hand-over order, none skipped: the files written after a hand-over show
  the books as of that hand-over.
- Finished leases are appended to leases.jsonl before the ledger of the same hand-over is
  written; a hand-over's future gives the size of leases.jsonl once its writes are done (what a
  checkpoint records, consumer/server/server.py `checkpoint_state`).
- A write that raises is kept (`error`) and fails that hand-over's future and every later one,
  unwritten (nothing is written out of order after a failed write); the network thread
  re-raises it at its next housekeeping: a run whose books cannot be written stops, with the
  file named (common/run_files.py), and `--resume` continues from its last checkpoint.
- The thread starts with the first hand-over and ends with `close`.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from common.files import run_files as RF
from common.files.disk import size_of
from common.files.net_stats import NetStats, write_net_stats
from common.wire import OUTCOMES
from consumer.server.leases import producer_balanced
from consumer.server.roster import Roster


@dataclass(frozen=True, slots=True)
class LedgerChanges:
    """ledger.json's content as of a hand-over, per producer only for those that changed:
    `totals` (`ok` None: the per-producer check is the writer's), {producer: (counts, open
    leases)} and {producer: host} of the changed producers, the counters, the backpressure."""

    totals: RF.Balance
    by_producer: dict[str, tuple[dict[str, int], int]]
    hosts: dict[str, str]
    counters: dict[str, int]
    admission: RF.BackpressureTotals | None
    policy_version: int


@dataclass(frozen=True, slots=True)
class BookChanges:
    """One hand-over: the producers' statuses that changed (None: forgotten), when ledger.json
    is due its changes (None: not rewritten this time), the network thread's timing (None: not
    rewritten), and the leases finished since the last hand-over, for leases.jsonl."""

    roster: dict[str, RF.ProducerStatus | None]
    ledger: LedgerChanges | None
    stats: NetStats | None
    finished: tuple[RF.LeaseLine, ...] = ()


class BookWriter:
    """Writes `run_dir`'s ledger.json and producers' files from the `BookChanges` it is handed."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.roster = Roster(run_dir)
        self.error: BaseException | None = None
        self._counts: dict[str, dict[str, int]] = {}  # producer -> counts
        self._open: dict[str, int] = {}  # producer -> open leases
        self._hosts: dict[str, str] = {}
        self._jobs: queue.SimpleQueue[tuple[BookChanges, Future[int]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, changes: BookChanges) -> Future[int]:
        """Queue `changes` (O(1)); the future completes once the files show them, with the size
        of leases.jsonl then."""
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="consumer-books", daemon=True)
                thread.start()
                self._thread = thread
        done: Future[int] = Future()
        self._jobs.put((changes, done))
        return done

    def close(self) -> None:
        """Write what was handed over, then end the thread."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            changes, done = job
            if self.error is not None:  # nothing after a failed write
                done.set_exception(self.error)
                continue
            try:
                done.set_result(self._write(changes))
            except BaseException as exc:  # kept for the network thread; the future says it too
                self.error = exc
                done.set_exception(exc)

    def _write(self, changes: BookChanges) -> int:
        RF.append_leases(self.run_dir, changes.finished)
        self.roster.apply(changes.roster)
        if changes.ledger is not None:
            RF.write_ledger(self.run_dir, self._ledger(changes.ledger))
        if changes.roster or changes.ledger is not None:
            self.roster.write()
        if changes.stats is not None:
            write_net_stats(self.run_dir, changes.stats)
        return size_of(self.run_dir / RF.LEASES)

    def _ledger(self, c: LedgerChanges) -> RF.Ledger:
        for p, (counts, open_leases) in c.by_producer.items():
            self._counts[p], self._open[p] = counts, open_leases
        self._hosts.update(c.hosts)
        ok = c.totals.issued == sum(c.totals.final(k) for k in OUTCOMES) + c.totals.open
        ok = ok and all(producer_balanced(n, self._open.get(p, 0)) for p, n in self._counts.items())
        return RF.Ledger(
            balance=dataclasses.replace(c.totals, ok=ok),
            by_producer=dict(self._counts),
            hosts={p: self._hosts.get(p, "") for p in self._counts},
            counters=c.counters,
            admission=c.admission,
            policy_version=c.policy_version,
        )
