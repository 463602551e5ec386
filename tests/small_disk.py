"""A small disk for disk-fault tests: a size-limited tmpfs mounted on a directory (root only),
and a filler file that leaves it full, or with a chosen number of bytes free."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = ".filler"


@contextlib.contextmanager
def small_disk(path: Path, size_mib: int) -> Iterator[Path]:
    """`path` as a tmpfs of `size_mib` MiB while the block runs (skips the test where this
    host cannot mount one: not root, or no mount namespace rights)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, *, leave_bytes: int = 0) -> Path:
    """Fill `disk` up to `leave_bytes` free with one file (whose removal frees it all)."""
    filler = disk / FILLER
    free = shutil.disk_usage(disk).free - leave_bytes
    if free <= 0:
        return filler  # already full (the run's own files)
    with open(filler, "ab") as f:
        block = b"\0" * (1 << 20)
        while free > 0:
            try:
                free -= f.write(block[: min(len(block), free)])
                f.flush()
            except OSError:
                break
    return filler


def free_up(disk: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(disk / FILLER)
