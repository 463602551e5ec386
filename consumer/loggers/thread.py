"""`Loggers`: the thread that feeds the experiment trackers and writes completions.jsonl.

The training thread calls `submit_step(record)` after each metrics line and
`submit_completions(step, groups)` every `log.completions_every` steps; both put one item on a
bounded queue (`QUEUE_ITEMS`) without waiting: when the queue is full (a tracker slower than
the learner) the item is dropped and counted (`dropped`). This thread starts the trackers
(`wandb.init` may take seconds: never on the training thread; each tracker runs in a niced
process of its own, consumer/loggers/child.py), logs the config once, then serves the queue. A
tracker that raises is reported once (one warning with the exception), counted (`failed`) and
dropped; the others and training go on. Catching every exception there
is deliberate: a tracker is third-party code at the edge of the process, like a bad message at
the network boundary. Completions are decoded here (the model's tokenizer, loaded on this
thread), appended to completions.jsonl (common/files/completions_file.py) and sent to the trackers.
`close()` drains the queue and closes the trackers, waiting at most `CLOSE_S`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import wire
from common.config import Config, to_dict, to_toml
from common.config.run import reward_names
from common.files import completions_file as CF
from common.files.metrics import StepRecord
from consumer.loggers.names import by_step

log = logging.getLogger("asyncgrpo.consumer")
QUEUE_ITEMS = 256
CLOSE_S = 60.0  # the longest shutdown waits for the trackers to finish (W&B syncing its files)
_TRACKERS = {  # log.report_to name -> its sink class, built in the tracker's child process
    "tensorboard": "consumer.loggers.tensorboard:TensorBoardSink",
    "wandb": "consumer.loggers.wandb:WandbSink",
}


class Loggers:
    def __init__(self, cfg: Config, run_dir: Path, model_dir: Path | None) -> None:
        self.cfg, self.run_dir, self.model_dir = cfg, run_dir, model_dir
        self.names = reward_names([r.fn for r in cfg.rewards.fns])
        self.dropped = 0  # items the full queue refused
        self.failed = 0  # trackers dropped after an exception
        self.completions_lost = 0  # completions samples a failed write of their file lost
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(QUEUE_ITEMS)
        self._thread = threading.Thread(target=self._run, name="loggers", daemon=True)
        self._sinks: list[Any] = []
        self._decode: Callable[[Sequence[int]], str] | None = None

    def start(self) -> None:
        self._thread.start()

    def submit_step(self, record: StepRecord) -> None:
        """Queue one step's metrics for the trackers (never waits; dropped when full)."""
        if self.cfg.log.report_to:
            self._put(("step", record))

    def submit_completions(self, step: int, groups: Sequence[wire.Group]) -> None:
        """Queue a completions sample (never waits; dropped when full)."""
        self._put(("completions", (step, list(groups))))

    def _put(self, item: tuple[str, Any]) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Serve what is queued, close the trackers; at most `CLOSE_S`."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=CLOSE_S)
        except queue.Full:
            log.warning("loggers: the queue did not drain in %.0f s; not waiting", CLOSE_S)
            return
        self._thread.join(CLOSE_S)
        if self._thread.is_alive():
            log.warning("loggers: trackers did not close within %.0f s; not waiting", CLOSE_S)

    # -- the logger thread -----------------------------------------------------------------
    def _run(self) -> None:
        self._sinks = self._open_sinks()
        self._each("config", to_toml(self.cfg))
        while (item := self._queue.get()) is not None:
            kind, payload = item
            if kind == "step":
                record: StepRecord = payload
                for step, values in by_step(record):  # a round's result at its version
                    self._each("metrics", step, values)
            else:
                step, groups = payload
                rows = CF.rows_of(
                    groups, step=step, decode=self._decoder(), reward_names=self.names
                )
                try:
                    CF.append(self.run_dir, rows)
                except OSError as exc:  # a full or failing disk: this sample is lost, counted
                    self.completions_lost += 1
                    log.warning("completions sample of step %d lost: %s", step, exc)
                self._each("completions", step, rows)
        self._each("close")

    def _open_sinks(self) -> list[Any]:
        run_name = self.cfg.log.run_name or self.run_dir.name
        config = to_dict(self.cfg)
        sinks: list[Any] = []
        for name in self.cfg.log.report_to:
            try:  # each in a niced process of its own (consumer/loggers/child.py)
                from consumer.loggers.child import ChildSink

                kwargs = {"run_dir": self.run_dir, "run_name": run_name, "config": config}
                if name == "wandb":
                    kwargs["project"] = self.cfg.log.project
                sinks.append(ChildSink(name, _TRACKERS[name], kwargs))
            except Exception as exc:  # a tracker's own failure: see the module docstring
                self._failed(name, exc)
        return sinks

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self._sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # a tracker's own failure: see the module docstring
                self._sinks.remove(sink)
                self._failed(sink.name, exc)

    def _failed(self, name: str, exc: BaseException) -> None:
        self.failed += 1
        log.warning(
            "logger %s failed (%s: %s): dropped for the rest of the run; training goes on "
            "(metrics.jsonl has every metric)",
            name,
            type(exc).__name__,
            exc,
        )

    def _decoder(self) -> Callable[[Sequence[int]], str]:
        """Token ids to text with the model's tokenizer (ids as numbers without a model)."""
        if self._decode is None:
            if self.model_dir is None:
                self._decode = lambda ids: " ".join(map(str, ids))
            else:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.model_dir)
                self._decode = lambda ids: str(tok.decode(list(ids)))
        return self._decode
