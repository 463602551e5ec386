"""Programs that attack their sandbox on purpose (the hostile-code suite and bench/sandbox.py).

`hostile_cases(outside, server_port, producer_pid)` returns name -> (program, the reasons that
count as contained). `outside` is a host directory the programs try to read (its `keys/secret`
and `run/metrics.jsonl`) and write (`planted`); `server_port` a TCP port listening on the host's
loopback; `producer_pid` the process a program tries to kill.
"""

from __future__ import annotations

from pathlib import Path

SECRET = "the-secret-key-material"


def plant(outside: Path) -> dict[str, bytes]:
    """The files a hostile program tries to read, and what the host holds afterwards."""
    (outside / "keys").mkdir(parents=True)
    (outside / "run").mkdir()
    (outside / "keys" / "secret").write_text(SECRET)
    (outside / "keys" / "secret").chmod(0o600)
    (outside / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    return snapshot(outside)


def snapshot(outside: Path) -> dict[str, bytes]:
    """Every file under `outside` with its bytes (to assert nothing changed)."""
    return {str(p.relative_to(outside)): p.read_bytes() for p in outside.rglob("*") if p.is_file()}


def hostile_cases(
    outside: Path, server_port: int, producer_pid: int
) -> dict[str, tuple[str, tuple[str, ...]]]:
    home = Path.home()
    return {
        "fork_bomb": (
            "import os\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass",
            ("timeout", "cpu"),
        ),
        "memory_bomb": (
            "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))",
            ("memory",),
        ),
        "infinite_loop": ("while True:\n    pass", ("cpu", "timeout")),
        "sleep_past_limit": ("import time\ntime.sleep(3600)", ("timeout",)),
        "huge_output": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", ("output",)),
        "write_outside_tmp": (
            "import os\nfor path in [{!r}, {!r}, '/usr/planted', '/planted', {!r}]:\n"
            "    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n"
            "    except OSError:\n        pass\n"
            "raise SystemExit(1)".format(
                str(outside / "planted"),
                str(outside / "run" / "metrics.jsonl"),
                str(home / "planted"),
            ),
            ("error",),
        ),
        "read_keys_and_run_dir": (
            "import os\nfound = []\nfor path in [{!r}, {!r}, {!r}]:\n"
            "    try:\n        found.append(open(path).read())\n    except OSError:\n        pass\n"
            "for d in [{!r}, {!r}]:\n"
            "    try:\n        found.extend(os.listdir(d))\n    except OSError:\n        pass\n"
            "print('LEAKED' if found else 'nothing', found)\n"
            "raise SystemExit(1)".format(
                str(outside / "keys" / "secret"),
                str(outside / "run" / "metrics.jsonl"),
                str(home / ".bashrc"),
                str(outside),
                str(home),
            ),
            ("error",),
        ),
        "loopback_connect": (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {server_port}), timeout=1)\n"
            "s.sendall(b'LEAKED')\nprint('CONNECTED')",
            ("error",),
        ),
        "kill_parent": (
            "import os, signal\n"
            f"for pid in (os.getppid(), {producer_pid}, 1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
            "os.kill(-1, signal.SIGKILL)",
            ("crash", "error"),
        ),
        "c_extension_crash": ("import ctypes\nctypes.string_at(0)", ("crash",)),
    }
