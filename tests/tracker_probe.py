"""A tracker for the tests of consumer/loggers/child.py's `ChildSink`: built, it starts a thread
and a process of its own, as W&B does (its service); `config(path)` writes to `path` the
niceness it was built at and the niceness and scheduling policy of every thread of its process
and of the process it started (JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path


class NicenessProbe:
    name = "probe"

    def __init__(self) -> None:
        self.built_at = os.getpriority(os.PRIO_PROCESS, 0)
        self._stop = threading.Event()
        threading.Thread(target=self._stop.wait, daemon=True).start()
        self._service = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )

    def config(self, path: str) -> None:
        def threads(pid: int) -> list[dict[str, int]]:
            return [
                {"nice": os.getpriority(os.PRIO_PROCESS, tid), "policy": os.sched_getscheduler(tid)}
                for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task"))
            ]

        started = threads(self._service.pid)
        got = {"built_at": self.built_at, "own": threads(os.getpid()), "started": started}
        Path(path).write_text(json.dumps(got))

    def close(self) -> None:
        self._stop.set()
        assert self._service.stdin is not None
        self._service.stdin.close()
        self._service.wait()
