"""Start the CLI as real processes in tests, and wait on files they write (no sleeps as sync)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common.files import run_files as RF


def cli(
    *args: str,
    log: Path,
    hide: tuple[Path, ...] = (),
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`python -m launch.cli ARGS` in its own process group, output to `log`. `hide`: directories
    the process sees empty (its own mount namespace, a tmpfs over each: another host's files; see
    `hiding_unavailable`); `cwd`, `env`: its directory and variables beside the usual ones."""
    tests_dir = str(Path(__file__).parent)  # reward_fixtures importable by producers
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH", "")) if p)
    usual = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    argv = [sys.executable, "-m", "launch.cli", *args]
    if hide:
        mounts = " && ".join(f"mount -t tmpfs none {shlex.quote(str(p))}" for p in hide)
        argv = ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **usual, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )


def hiding_unavailable() -> str:
    """Why `cli(..., hide=...)` cannot run here ("" when it can): it needs root and unshare."""
    if os.geteuid() != 0:
        return "hiding a directory needs root (a mount namespace with a tmpfs over it)"
    if shutil.which("unshare") is None:
        return "needs util-linux (unshare)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return probe.stderr.decode().strip() if probe.returncode else ""


def run_to_end(*args: str, log: Path, timeout_s: float) -> None:
    """`cli(*args)` run to its end: exit 0 within `timeout_s`, else fail with its log's tail."""
    proc = cli(*args, log=log)
    try:
        assert proc.wait(timeout_s) == 0, log.read_text()[-3000:]
    finally:
        stop(proc)


def wait_for(predicate: Any, *, timeout_s: float, what: str, procs: list[Any] = ()) -> Any:  # type: ignore[assignment]
    """Poll `predicate()` until it returns a truthy value; fail with `what` after `timeout_s`.

    Fails early if one of `procs` exits while we wait.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                argv = [str(a) for a in p.args]  # the command's words, after any wrapper
                shown = argv[argv.index("launch.cli") + 1 :][:2] if "launch.cli" in argv else argv
                raise AssertionError(f"{what}: process {shown} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def endpoint(run_dir: Path, procs: list[Any] = (), timeout_s: float = 120) -> str:  # type: ignore[assignment]
    path = run_dir / RF.ENDPOINTS
    wait_for(path.exists, timeout_s=timeout_s, what="the consumer's endpoints.json", procs=procs)
    return RF.read_endpoints(path).control


def stop(*procs: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
