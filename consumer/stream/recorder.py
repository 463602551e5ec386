"""Records what the learner consumed, off the training thread (`run.record_stream`).

The training thread (and the publisher's, for snapshots) only put objects on a queue:
`group(g)` for every admitted group, `step(entry)` after each optimizer step, `snapshot(info)`
when a snapshot is published. The recorder's own thread encodes them (groups as their wire
bytes, `common.wire.encode`, deterministic) and appends them to RUN/stream/ segments
(consumer/stream/segments.py). An error in that thread is re-raised by the next call.

Checkpoints and resume: `position()` waits until everything queued is written, flushes and
fsyncs, and returns (segment, bytes); the learner stores it with the checkpoint's log sizes.
A resumed run cuts the stream back to it (`resume_from`), so the stream holds exactly the
timeline the run continues, like `leases.jsonl` and `metrics.jsonl`. A kill -9 leaves at most
a torn tail in the newest segment, which opening the writer again cuts back to the last whole
record (and after a resume falls after the checkpoint's position anyway).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from pathlib import Path

from common import wire
from common.files import run_files as RF
from common.files.disk import disk_fault
from consumer.stream import segments as S
from consumer.stream.records import SnapshotEntry, StepEntry

log = logging.getLogger("asyncgrpo.consumer")
STREAM = RF.STREAM
_Item = tuple[int, object] | Future[tuple[str, int]] | None


class Recorder:
    def __init__(self, run_dir: Path, *, resume_from: tuple[str, int] | None = None) -> None:
        directory = run_dir / STREAM
        if resume_from is not None:
            gone = S.cut_after(directory, Path(resume_from[0]).name, resume_from[1])
            if gone:
                log.info("resume: removed stream segments %s of the interrupted run", gone)
        self._writer = S.SegmentWriter(directory, schema=wire.SCHEMA_VERSION)
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    @property
    def bytes_written(self) -> int:
        return self._writer.bytes_written

    # -- any thread ----------------------------------------------------------------------------
    def group(self, g: wire.Group) -> None:
        self._put((S.GROUP, g))

    def step(self, entry: StepEntry) -> None:
        self._put((S.STEP, entry))

    def snapshot(self, info: wire.SnapshotInfo) -> None:
        self._put((S.SNAPSHOT, SnapshotEntry(info.version, info.hash)))

    def position(self) -> tuple[str, int]:
        """Where the stream ends once everything queued so far is durable (relative path)."""
        done: Future[tuple[str, int]] = Future()
        self._put(done)
        return done.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _put(self, item: _Item) -> None:
        self._raise()
        self._queue.put(item)

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("the stream recorder failed") from self._error

    # -- the recorder's thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                if isinstance(item, Future):
                    where = self._writer.position()
                    self._writer.sync()
                    item.set_result(where)
                    continue
                kind, obj = item
                if kind == S.GROUP:
                    assert isinstance(obj, wire.Group)
                    self._writer.append(kind, wire.encode(obj))
                else:
                    assert isinstance(obj, StepEntry | SnapshotEntry)
                    self._writer.append(kind, obj.to_bytes())
                if self._queue.empty():
                    self._writer.flush()  # in the page cache: a kill -9 loses nothing
        except BaseException as exc:
            self._error = exc
            if disk_fault(exc) is None:  # a disk fault: the consumer's top says it in one line
                log.exception("stream recorder failed")
            while not self._queue.empty():  # nobody waits for ever on a position
                left = self._queue.get()
                if isinstance(left, Future):
                    left.set_exception(exc)
        finally:
            try:
                self._writer.close()
            except OSError:
                if self._error is None:
                    raise


def resume_position(log_sizes: dict[str, int]) -> tuple[str, int] | None:
    """The stream's position in a checkpoint's log sizes (None: recorded without a stream)."""
    found = [(name, size) for name, size in log_sizes.items() if name.startswith(STREAM + "/")]
    return found[0] if found else None
