"""Work other threads hand to the network thread: callables run there, between socket events.

`submit` queues a callable and returns a future for its result (or its exception, re-raised on
the caller's thread by `Future.result`); a byte on a socket pair wakes the loop at once (the
read end is in its poller), so the training thread never waits out a poll timeout. The loop
runs what is queued (`run`) after every poll. Once the network thread has stopped or failed,
nothing new is run: every future fails with a one-line `RuntimeError` instead.
"""

from __future__ import annotations

import contextlib
import queue
import socket
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
STOPPED = "the consumer's network thread has stopped"


class Calls:
    """A queue of (callable, future) from any thread to the network thread, and its wake-up."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._wake_recv, self._wake_send = socket.socketpair()  # a call is queued: poll returns
        self._wake_recv.setblocking(False)
        self._wake_send.setblocking(False)

    def fileno(self) -> int:
        """The descriptor the network thread polls: readable when a call was queued."""
        return self._wake_recv.fileno()

    def submit(self, fn: Callable[[], T], *, stopped: bool) -> Future[T]:
        """Queue `fn` for the network thread (any thread); a failed future if `stopped`."""
        fut: Future[T] = Future()
        if stopped:
            fut.set_exception(RuntimeError(STOPPED))
            return fut
        self._queue.put((fn, fut))
        # OSError: already full of wake-ups (the loop will run), or the thread has ended
        with contextlib.suppress(OSError):
            self._wake_send.send(b"\0")
        return fut

    def pending(self) -> bool:
        """A call is queued (any thread may ask; the answer may be stale by the time it returns)."""
        return not self._queue.empty()

    def take_wake_ups(self) -> None:
        """Empty the wake-up socket (the network thread, when poll said it is readable)."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_recv.recv(4096):
                pass

    def run(self, *, stopped: Callable[[], bool]) -> None:
        """Run every queued call (the network thread); each future gets its result or exception.
        A call is refused instead once `stopped()` (asked before each: a call that fails can
        stop the thread, and then the calls queued after it are refused)."""
        while True:
            try:
                fn, fut = self._queue.get_nowait()
            except queue.Empty:
                return
            if stopped():
                fut.set_exception(RuntimeError(STOPPED))
            elif fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # delivered to the caller's thread
                    fut.set_exception(exc)

    def fail_all(self) -> None:
        """The network thread failed: every call still queued fails."""
        while not self._queue.empty():
            self._queue.get_nowait()[1].set_exception(RuntimeError("network thread failed"))

    def close(self) -> None:
        self._wake_recv.close()
        self._wake_send.close()
