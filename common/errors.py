"""Exceptions that cross module boundaries.

`ConfigError`, `SnapshotError` and `StreamError` are for users (bad settings, corrupt files):
their message says what is wrong and which key or file to change. `WireError` carries a short
`reason` code that is used as a metrics key (`rejected.<reason>`).
Programmer invariants use `assert`, not these.

The exit codes of the processes (`asyncgrpo launch`, `consumer`, `producer`), which a supervisor
(launch/local.py, a sweep, a shell) reads to decide whether a restart can help:
- `EXIT_CONFIG` (2): the run cannot succeed as configured (a `ConfigError`: a reward module that
  does not import, a missing data file, a model that does not load); one `error:` line says
  why. Restarting changes nothing, so nothing restarts it.
- `EXIT_NO_SIGNAL` (3, the consumer): stopped because the arriving groups carried no learning
  signal for `run.no_signal_groups` groups or `run.no_signal_s` seconds (consumer/no_signal.py);
  the reason is in final.json and summary.md.
- `EXIT_CONSUMER_LOST` (3, a producer): its consumer went silent, or never answered; a restart
  may find it.
- `EXIT_INTERRUPTED` (130): stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells say).
"""

from __future__ import annotations

EXIT_CONFIG = 2
EXIT_NO_SIGNAL = 3
EXIT_CONSUMER_LOST = 3
EXIT_INTERRUPTED = 130


class AsyncGRPOError(Exception):
    """Base class of the errors this project raises on purpose."""


class ConfigError(AsyncGRPOError, ValueError):
    """An impossible or malformed setting; the message names the key to change."""


class SnapshotError(AsyncGRPOError, ValueError):
    """A snapshot file that is missing, partial or whose hash does not match its manifest."""


class SnapshotMismatch(SnapshotError):
    """A snapshot whose tensors do not fit the model (names or shapes): its bytes are fine, the
    model is wrong, so no retry can help."""


class StreamError(AsyncGRPOError, ValueError):
    """A recorded stream (RUN/stream/) that cannot be replayed as it is: a missing, truncated or
    corrupt segment, another format or schema version, or a config that does not match it. The
    message names the file and, where one is concerned, the step."""


class EvalError(AsyncGRPOError, RuntimeError):
    """A held-out evaluation that raised, or whose process died; the message names the version."""


class WireError(AsyncGRPOError, ValueError):
    """A message that cannot be accepted. `reason` is a short code (a metrics key)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        # Best effort, for a group that parsed but failed a check: whom to tell, about what.
        self.lease_id: int | None = None
        self.producer_id: str | None = None


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, at most `limit` characters (libraries write
    pages); its type's name when it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
