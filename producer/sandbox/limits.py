"""What one sandboxed execution may use, and how it ended.

`Limits` bounds one execution (the sandbox's process and everything it starts); `Execution` is
what comes back: the captured output (each stream cut at the output limit), the exit code and
one `reason` from `REASONS`:
- `ok`: exited 0.  `error`: exited non-zero by itself (an exception, `sys.exit(3)`).
- `timeout`: still running at `wall_s` (a sleep, a loop waiting on something); killed.
- `cpu`: used `cpu_s` seconds of CPU (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later).
- `memory`: an allocation past `memory_mib` failed (RLIMIT_AS) and the program died of it.
- `output`: wrote more than `max_output_bytes` to stdout and stderr together; killed.
- `crash`: died of a signal (a segfault in C code, `abort()`, SIGKILL of itself).
Nothing here runs anything: producer/sandbox/runner.py does.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONS = ("ok", "error", "timeout", "cpu", "memory", "output", "crash")
MEMORY_EXIT = (
    86  # the prelude's exit code for an uncaught MemoryError (producer/sandbox/prelude.py)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """One execution's bounds. Memory and CPU are per process (rlimits); processes counts every
    process and thread the execution has at once (RLIMIT_NPROC of its own user id)."""

    wall_s: float = 5.0  # wall-clock seconds, from start to the last output read
    cpu_s: float = 5.0  # CPU seconds per process (RLIMIT_CPU, whole seconds rounded up)
    memory_mib: int = 256  # address space per process (RLIMIT_AS), MiB
    max_processes: int = 16  # processes and threads at once (RLIMIT_NPROC)
    max_open_files: int = 64  # file descriptors per process (RLIMIT_NOFILE)
    max_output_bytes: int = 1 << 20  # stdout + stderr together; more is cut and the run killed
    tmp_mib: int = 16  # the private /tmp (a tmpfs of this size; also RLIMIT_FSIZE)
    cpu_share: float = 1.0  # CPUs all its processes may use at once (a cgroup quota, if allowed)

    def problems(self) -> list[str]:
        """What makes these limits impossible (an empty list when they can run)."""
        out = []
        if not (self.wall_s > 0 and self.cpu_s > 0):
            out.append("wall_s and cpu_s must be > 0")
        if self.memory_mib < 32:
            out.append("memory_mib must be >= 32 (the interpreter itself needs ~20 MiB)")
        if self.max_processes < 1 or self.max_open_files < 8:
            out.append("max_processes must be >= 1 and max_open_files >= 8")
        if self.max_output_bytes < 1 or self.tmp_mib < 1:
            out.append("max_output_bytes and tmp_mib must be >= 1")
        if not 0.01 <= self.cpu_share <= 1024:
            out.append("cpu_share must be between 0.01 and 1024 CPUs")
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """How one execution ended: see the module docstring for `reason`."""

    reason: str
    stdout: str
    stderr: str
    exit_code: int | None  # None when it was killed (timeout, output) or died of a signal
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.reason == "ok"
