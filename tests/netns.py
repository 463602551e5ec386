"""Hosts as Linux network namespaces on one Ethernet segment, for multi-host tests and benches.

`Hosts(["a", "b", "c"])` creates one namespace per host and a switch namespace holding a
bridge; each host is joined to the bridge by a veth pair (its end is `eth0`, address
10.77.0.N/24 in the order given). Nothing is routed to or from the machine's own network, so
the addresses never collide with anything, and every name carries a random suffix so that runs
side by side do not either. `cut(host)` / `mend(host)` take a host's link down and up (the
switch end, so the host itself sees nothing but silence), `netem(host, ...)` delays and drops
its packets, `limit(host, mbit)` caps its link's rate each way (tc's tbf). `run(host, argv)`
starts a process inside it; with `hide` the process also gets its own mount namespace where
those directories are empty (no shared files between hosts).
Needs root and iproute2; `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def unavailable() -> str:
    """Why hosts cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"agp{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.decode().strip()}"
    _ip("netns", "del", probe)
    return ""


class Hosts:
    def __init__(self, names: list[str]) -> None:
        self.tag = secrets.token_hex(3)
        self.names = list(names)
        self.switch = f"ag{self.tag}sw"
        self.ns = {n: f"ag{self.tag}{n}" for n in names}
        self._port = {n: f"ag{self.tag}{i}s" for i, n in enumerate(names)}
        self.addr = {n: f"10.77.0.{i + 1}" for i, n in enumerate(names)}

    def __enter__(self) -> Hosts:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns, host_end = self.ns[name], f"ag{self.tag}{i}h"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", self._port[name])
                _ip("link", "set", host_end, "netns", ns)
                _ip("link", "set", self._port[name], "netns", self.switch)
                _ip("-n", self.switch, "link", "set", self._port[name], "master", "br0", "up")
                _ip("-n", ns, "link", "set", host_end, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in [self.switch, *self.ns.values()]:  # a namespace takes its veth ends with it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def cut(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self._port[name], "down")

    def mend(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self._port[name], "up")

    def netem(self, name: str, *args: str) -> str:
        """`tc qdisc ... netem ARGS` on the host's link; the error ("" on success): kernels
        without sch_netem refuse it."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.ns[name], "tc", "qdisc", "add", "dev", "eth0", "root",
             "netem", *args],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return out.stderr.strip() if out.returncode else ""

    def limit(self, name: str, mbit: float) -> str:
        """Limit the host's link to `mbit` Mbit/s each way with `tc ... tbf` (its own end for
        what it sends, the switch's end for what it receives); the error ("" on success)."""
        rate_bytes = mbit * 1e6 / 8
        tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(max(16_000, int(rate_bytes / 100))),
               "latency", "200ms"]  # fmt: skip
        for ns, dev in ((self.ns[name], "eth0"), (self.switch, self._port[name])):
            out = subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if out.returncode:
                return out.stderr.strip()
        return ""

    def argv(self, name: str, argv: list[str], hide: tuple[Path, ...] = ()) -> list[str]:
        """`argv` run inside host `name`, with the directories `hide` empty for it."""
        if not hide:
            return ["ip", "netns", "exec", self.ns[name], *argv]
        mounts = " && ".join(f"mount -t tmpfs none '{p}'" for p in hide)
        shell = f'{mounts} && exec "$@"'
        return ["ip", "netns", "exec", self.ns[name], "unshare", "-m", "sh", "-c", shell, "sh",
                *argv]  # fmt: skip

    def run(self, name: str, argv: list[str], *, log: Path, hide: tuple[Path, ...] = (),
            **kw: Any) -> subprocess.Popen[bytes]:  # fmt: skip
        """Start `argv` inside host `name` in its own process group, output to `log`."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                self.argv(name, argv, hide), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, **kw,
            )  # fmt: skip
