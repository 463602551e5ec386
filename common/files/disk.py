"""Disk faults: which file a failed write was for, whether an error is the disk's, and the one
line a run that must stop for it prints.

The consumer's writes are of two kinds. What a resumed run needs (snapshots, checkpoints,
leases.jsonl, ledger.json and the files written with it, the recorded stream) stops the run
when its write fails: the error
travels to the consumer's top, which prints `stop_line` (the file, the error, what to do) and
exits 1; `--resume`, once the disk has room, continues from the last checkpoint, whose files
were each written whole or not at all (temp names, fsync, rename) and whose append-only logs are
cut back to the sizes it recorded. What only reports from the training side (metrics.jsonl
lines, completions samples) is dropped when its write fails, counted, and logged.

`writing(path)` names the file on an OSError raised inside it (a write or fsync on an open
file carries no name), so whichever thread catches it can say which file it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

FULL_BYTES = 1 << 20  # a filesystem with less free is full, for `from_library`
# A full disk, a quota, a failing or read-only disk, a file too large: no retry helps.
FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Give an OSError raised in the block the name of `path` if it has none."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def replace_text(path: Path, text: str) -> None:
    """`text` as `path`, atomically: a temporary name, then a rename (readers see the old file
    or the new one, never a part). An OSError names `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with writing(path):
        tmp.write_text(text)
        tmp.replace(path)


def append_text(path: Path, text: str) -> None:
    """Append `text` to `path` (nothing when empty). An OSError names `path`; a failed append
    may leave a torn last line (readers skip it; `--resume` cuts the file back)."""
    if text:
        with writing(path), open(path, "a") as f:
            f.write(text)


def disk_fault(exc: BaseException) -> OSError | None:
    """The disk fault (an OSError of `FAULTS`) that `exc` is or was raised from, if any."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, OSError) and at.errno in FAULTS:
            return at
        at = at.__cause__ or at.__context__
    return None


def stop_line(fault: OSError) -> str:
    """What a run stopped by `fault` says, in one line."""
    name = errno.errorcode.get(fault.errno or 0, str(fault.errno))
    where = fault.filename or "a file of the run directory"
    return (
        f"cannot write {where}: {fault.strerror} ({name}); the run stopped: free space on that "
        "disk (or replace it), then run the same command with --resume"
    )


def from_library(exc: Exception, path: Path) -> OSError | None:
    """The disk fault behind an error a library raised while writing `path`, when it can be
    told: safetensors' Rust I/O errors name the OS error; torch.save's C++ writer says only
    "unexpected pos", so a full filesystem (under 1 MiB free after the failure) is taken as
    ENOSPC. None when it cannot be told (an EIO inside torch.save stays torch's error)."""
    found = re.search(r"os error (\d+)", str(exc))
    if found:
        code = int(found[1])
        return OSError(code, os.strerror(code), str(path))
    if isinstance(exc, RuntimeError) and shutil.disk_usage(path.parent).free < FULL_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


def size_of(path: Path) -> int:
    """The size of `path`, 0 when it does not exist."""
    return path.stat().st_size if path.exists() else 0
