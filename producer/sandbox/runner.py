"""Run one program in the sandbox: `run_python(code, stdin=..., limits=...) -> Execution`.

Each call is one process tree of its own (producer/sandbox/jail.py makes it: namespaces where
the host allows them, the prelude's rlimits always), fed `stdin`, its stdout and stderr read as
they come, and ended by whichever comes first: its own exit, `Limits.wall_s`, or more output
than `Limits.max_output_bytes` (then it is killed, and what it wrote up to the limit is kept).
How it ended is one reason of producer/sandbox/limits.py `REASONS`.

Invariants:
- When `run_python` returns or raises (a reward worker's alarm included), nothing it started
  still runs: the sandbox's process group is killed, and in the bubblewrap mechanisms the death
  of its PID namespace's first process takes every other process of the namespace with it.
- The program's text reaches the sandbox through a memory file (memfd), never the disk; in the
  rlimits mechanism, through a private directory removed afterwards.
- Safe to call from several threads at once; each call blocks its own thread only.
- `SandboxError` (a ValueError) for impossible limits; `OSError` when the sandbox cannot start.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from producer.sandbox.cgroups import ExecutionGroups
from producer.sandbox.jail import PRELUDE, Mechanism, bwrap_binary, bwrap_command, mechanism
from producer.sandbox.limits import MEMORY_EXIT, Execution, Limits

UID_BASE, UID_SPAN = 1_800_000_000, 1 << 24  # the executions' user ids (root mechanisms)
_serial = itertools.count()
KILL_WAIT_S = 10.0  # longest wait for a killed namespace to empty before bwrap itself is killed


class SandboxError(ValueError):
    """Limits that cannot run (a one-line reason)."""


def run_python(code: str, *, stdin: str | bytes = b"", limits: Limits | None = None) -> Execution:
    """Run the Python program `code` in a sandbox of its own; see the module docstring."""
    limits = limits or Limits()
    problems = limits.problems()
    if problems:
        raise SandboxError(f"sandbox limits: {'; '.join(problems)}")
    data = stdin.encode() if isinstance(stdin, str) else stdin
    how = mechanism()
    uid = UID_BASE + (os.getpid() * 4096 + next(_serial)) % UID_SPAN
    settings = _settings(limits, uid if os.geteuid() == 0 else None)
    started = time.monotonic()
    if how == "rlimits":
        return _run_plain(code, data, limits, settings, uid, started)
    bwrap = bwrap_binary()
    assert bwrap is not None, "mechanism() found it"
    groups = ExecutionGroups()
    if how == "bwrap-root":
        groups = ExecutionGroups.make(
            cpu_share=limits.cpu_share, max_processes=limits.max_processes
        )
        settings["cgroups"] = ",".join(groups.dirs)
    program = os.memfd_create("program", 0)
    status_r, status_w = os.pipe()
    try:
        os.write(program, code.encode())
        os.lseek(program, 0, os.SEEK_SET)
        cmd = bwrap_command(
            bwrap,
            how,
            tmp_bytes=limits.tmp_mib << 20,
            program_fd=program,
            status_fd=status_w,
            settings=_text(settings),
            cgroup_procs=groups.procs_files(),
        )
        proc = _start(cmd, pass_fds=(program, status_w), cwd=None)
    except BaseException:
        groups.remove()
        raise
    finally:
        os.close(program)
        os.close(status_w)
    try:
        init = _namespace_init(status_r, proc)
        return _finish(proc, data, limits, started, how, init)
    finally:
        os.close(status_r)
        groups.remove()  # every process of the execution is reaped by now


def _settings(limits: Limits, uid: int | None) -> dict[str, str]:
    """The prelude's settings (producer/sandbox/prelude.py `parse` reads them back)."""
    cpu = math.ceil(limits.cpu_s)
    return {
        "RLIMIT_CPU": f"{cpu},{cpu + 1}",  # SIGXCPU at the soft limit, SIGKILL a second later
        "RLIMIT_AS": str(limits.memory_mib << 20),
        "RLIMIT_NPROC": str(limits.max_processes),
        "RLIMIT_NOFILE": str(limits.max_open_files),
        "RLIMIT_FSIZE": str(limits.tmp_mib << 20),
        "RLIMIT_CORE": "0",
        "uid": str(uid or 0),
    }


def _text(settings: dict[str, str]) -> str:
    assert not any(";" in v or "=" in k for k, v in settings.items()), settings
    return ";".join(f"{k}={v}" for k, v in settings.items())


def _run_plain(
    code: str, data: bytes, limits: Limits, settings: dict[str, str], uid: int, t0: float
) -> Execution:
    """The rlimits mechanism: a plain child in a private directory, the audit hook on."""
    folder = Path(tempfile.mkdtemp(prefix="asyncgrpo-sandbox-"))
    try:
        program = folder / "main.py"
        program.write_text(code)
        if os.geteuid() == 0:
            os.chown(folder, uid, uid)
        settings = {**settings, "audit": f"{folder}:{os.path.realpath(sys.base_prefix)}"}
        python = os.path.realpath(sys.executable)
        cmd = [python, "-I", "-S", str(PRELUDE), _text(settings), str(program)]
        proc = _start(cmd, pass_fds=(), cwd=str(folder))
        return _finish(proc, data, limits, t0, "rlimits")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _start(
    cmd: list[str], *, pass_fds: tuple[int, ...], cwd: str | None
) -> subprocess.Popen[bytes]:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd or "/tmp"}
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )


def _namespace_init(status_fd: int, proc: subprocess.Popen[bytes]) -> int | None:
    """A pidfd of the sandbox's first process in its PID namespace (bwrap's `child-pid`), or
    None if bwrap ended before naming it (it could not start)."""
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([status_fd], [], [], 10.0)
        chunk = os.read(status_fd, 4096) if ready else b""
        if not chunk:
            return None
        line += chunk
    try:
        return os.pidfd_open(int(json.loads(line.split(b"\n")[0])["child-pid"]))
    except (ValueError, KeyError, ProcessLookupError):
        return None  # it has already exited: its namespace went with it


def _finish(
    proc: subprocess.Popen[bytes],
    data: bytes,
    limits: Limits,
    t0: float,
    how: Mechanism,
    init: int | None = None,
) -> Execution:
    """Feed, read, end and classify one started sandbox (killing it whatever happens)."""
    killed: str | None = None
    out: dict[int, bytearray] = {}
    try:
        killed = _pump(proc, data, limits, t0, out)
        if killed is None:
            try:
                proc.wait(max(0.0, t0 + limits.wall_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed = "timeout"
    finally:
        _kill(proc, init)
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdout = bytes(out.get(proc.stdout.fileno(), b""))
    stderr = bytes(out.get(proc.stderr.fileno(), b""))
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    code = proc.returncode
    return Execution(
        reason=killed or _reason(code, how),
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
        exit_code=None if killed or _signal_of(code, how) else code,
        wall_s=time.monotonic() - t0,
    )


def _pump(
    proc: subprocess.Popen[bytes], data: bytes, limits: Limits, t0: float, out: dict[int, bytearray]
) -> str | None:
    """Write stdin and read stdout and stderr until both close; "timeout" or "output" if it
    had to stop early."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    budget = limits.max_output_bytes
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            out[stream.fileno()] = bytearray()
            sel.register(stream.fileno(), selectors.EVENT_READ)
        stdin_fd, sent = proc.stdin.fileno(), 0
        if data:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while sel.get_map():
            remaining = t0 + limits.wall_s - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for key, _ in sel.select(remaining):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        sent += os.write(fd, data[sent : sent + 65536])
                    except BrokenPipeError:
                        sent = len(data)
                    if sent >= len(data):
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                room = budget - sum(len(b) for b in out.values())
                out[fd] += chunk[: max(room, 0)]
                if len(chunk) > room:
                    return "output"
    return None


def _kill(proc: subprocess.Popen[bytes], init: int | None) -> None:
    """SIGKILL the sandbox and reap it. In a PID namespace its first process (`init`, a pidfd)
    is killed, and bwrap, its parent, exits only once that process is gone, which the kernel
    allows only after every other process of the namespace has died; then bwrap is reaped."""
    if init is not None:
        try:
            if proc.returncode is None:
                signal.pidfd_send_signal(init, signal.SIGKILL)
                proc.wait(KILL_WAIT_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        finally:
            os.close(init)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_of(code: int | None, how: Mechanism) -> int:
    """The signal that ended the program (bwrap reports a child's signal as 128 + its number)."""
    if code is None:
        return 0
    if code < 0:
        return -code
    if how != "rlimits" and 128 < code < 128 + 65:
        return code - 128
    return 0


def _reason(code: int | None, how: Mechanism) -> str:
    sig = _signal_of(code, how)
    if sig in (signal.SIGXCPU, signal.SIGKILL) and sig == signal.SIGXCPU:
        return "cpu"
    if sig:
        return "crash"
    if code == MEMORY_EXIT:
        return "memory"
    return "ok" if code == 0 else "error"
