"""The first code a sandboxed execution runs, inside the sandbox, before the program it was given.

Started as `python -I -S prelude.py SETTINGS PROGRAM_PATH` (isolated mode: no environment
variables, no user site, no current directory on sys.path; no site-packages). It imports
nothing of this project: only the standard library is there, and not even json (its import
would double the interpreter's start-up): SETTINGS is `key=value` pairs joined by `;`, e.g.
`uid=1800000001;RLIMIT_CPU=1,2;RLIMIT_AS=268435456;audit=/tmp/x:/usr` (runner.py writes it).
In order:
1. moves itself into the execution's cgroups, if it has any (a CPU quota, a process cap:
   producer/sandbox/cgroups.py), and sets the rlimits it is given (soft = hard: no process
   in the sandbox can raise them again);
2. if it runs as root (the privileged bubblewrap mode, producer/sandbox/jail.py), drops to the
   execution's own user and group id with no supplementary groups: capabilities go with uid 0,
   and bubblewrap has set no_new_privs, so nothing setuid can bring them back;
3. with `audit` set (the rlimits-only mode, on a host where no namespace can be made), installs
   an audit hook that refuses sockets, new processes, ctypes and any file outside the private
   directory and the interpreter's own files (a hurdle, not a wall: docs/sandbox.md);
4. runs the program as `__main__`. An uncaught MemoryError exits with MEMORY_EXIT (86) so the
   runner can tell a memory limit from an ordinary error.
"""

from __future__ import annotations

import os
import resource
import sys

MEMORY_EXIT = 86  # producer/sandbox/limits.py MEMORY_EXIT


def parse(text: str) -> dict[str, str]:
    """SETTINGS as a dict of strings."""
    return dict(pair.split("=", 1) for pair in text.split(";") if pair)


def _limit(settings: dict[str, str]) -> None:
    for name in settings.get("cgroups", "").split(","):  # the execution's own (cgroups.py)
        if name:
            with open(f"/sandbox/cgroup/{name}", "w") as f:
                f.write(str(os.getpid()))
    for name, value in settings.items():
        if name.startswith("RLIMIT_"):
            soft, _, hard = value.partition(",")
            resource.setrlimit(getattr(resource, name), (int(soft), int(hard or soft)))
    uid = int(settings.get("uid") or 0)
    if uid and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _audit(allowed_dirs: list[str]) -> None:
    """Refuse what a contained program has no business doing (rlimits-only mode)."""
    allowed = tuple(os.path.realpath(d) + os.sep for d in allowed_dirs)
    refused = frozenset(
        (
            *("socket.__new__", "socket.connect", "socket.bind", "socket.sendto"),
            *("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"),
            *("os.fork", "os.forkpty", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata"),
            "ctypes.call_function",
        )
    )

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in refused:
            raise PermissionError(f"sandbox: {event} is refused")
        if event in ("open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir"):
            path = args[0]
            if not isinstance(path, str | bytes | os.PathLike):
                return  # a file descriptor, or None
            real = os.path.realpath(os.fsdecode(path))
            if not (real + os.sep).startswith(allowed):
                raise PermissionError(f"sandbox: {real} is outside the sandbox")

    sys.addaudithook(hook)


def main() -> None:
    settings = parse(sys.argv[1])
    program = sys.argv[2]
    with open(program, "rb") as f:
        source = f.read()
    _limit(settings)
    if settings.get("audit"):
        _audit(settings["audit"].split(":"))
    sys.argv = [program]
    namespace = {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__}
    try:
        exec(compile(source, program, "exec"), namespace)
    except MemoryError:
        sys.stderr.write("MemoryError: the sandbox's memory limit\n")
        sys.stderr.flush()
        os._exit(MEMORY_EXIT)


if __name__ == "__main__":
    main()
