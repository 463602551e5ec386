"""Snapshot layout, manifest, hashing, verification, and whether a snapshot fits a model (no torch
here; see consumer/snapshots/publisher.py).

A snapshot is a directory `<run>/snapshots/v<version:06d>/` that is a complete Hugging Face model
directory: `model.safetensors` (the policy's full state dict in HF parameter names), the base
model's config and tokenizer files, and `manifest.json`:

    {"version": int, "step": int, "hash": "<blake3 hex of model.safetensors>",
     "num_bytes": int, "dtype": "bfloat16" | "float32", "created_unix": float,
     "writer": "<hostname>/<boot id> of the process that wrote and hashed the file",
     "base_hash": "" for a whole model, else the hash of the base model an adapter applies to}

With `model.lora.enabled` the snapshot is a LoRA adapter instead (common/weights/adapter.py):
`model.safetensors` holds the adapter's matrices and says so in its header, and peft's
`adapter_config.json` and `adapter_model.safetensors` (a link to the same file) replace the base
model's config and tokenizer files; everything below holds for it alike.

and, added just after the announcement for network fetchers, `chunks.json` (per-chunk hashes,
common/weights/chunk_manifest.py) and, unless the version is an anchor, `weights.delta`
(common/weights/delta.py; consumer/snapshots/fetch_files.py says when).

Invariants:
- A snapshot directory exists under its final name only when complete: it is written under a
  temporary name, every file fsynced, then renamed (atomic on POSIX), then the parent fsynced.
  (`fsync=False` skips the fsyncs, not the rename: the publisher's `snapshot.fsync` policy.)
- Nobody loads weights whose BLAKE3 hash or size disagrees with the manifest (`verify_file`,
  `verify_bytes` raise `SnapshotError`); a producer that fails to verify keeps its weights.
- What is loaded is what was verified. A producer never loads the consumer's file by its path
  after checking it (a resumed run rewrites `v<version>` with other bytes; pruning removes it):
  `pin_local` opens the file once, verifies it through that descriptor, and puts that very file
  (a hard link to the open inode) or, across filesystems, a copy hashed as it is written, into
  the producer's private directory, from which the engine loads. Publication never writes a
  file in place (new files, renamed directories), so the pinned inode keeps its bytes.
  The one shortcut: the hash in a manifest whose `writer` is this very host (same hostname and
  kernel boot: one page cache) describes the bytes that process wrote from its own memory, so a
  reader on that host may take it instead of hashing the file again (`written_here`).
- BLAKE3 (multi-threaded) rather than SHA-256/BLAKE2b: hashing must not dominate a publish.
  `write_file` hashes the memory it wrote on a second thread while the file is fsynced.
- Versions belong to one timeline. A consumer resumed from its checkpoint at version v goes on
  from v, so the snapshots above v that the interrupted run had published were never trained
  on by the new timeline: `remove_newer` deletes them at resume (else they would shadow its
  own later versions of the same numbers, and pruning by number would delete the live ones).
  `<run>/final.json` (`write_final` / `final_version`) names the version a run ended with; a
  resumed run removes it until it ends again. Readers take the run's result from there, not
  from the highest number on disk.
- Nobody loads a snapshot whose tensors do not fit the model (`check_fits`, one rule for the hf
  and vllm engines and the evaluator): every file tensor names a model tensor of the same shape,
  and every model tensor is in the file unless it shares storage with one that is (tied
  embeddings, which `save_pretrained` writes once) or the caller lists it as `optional`.
  Shapes come from the safetensors headers (`tensor_shapes`, through `safe_open`: no tensor is
  read).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Collection, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import blake3
from safetensors import SafetensorError, safe_open

from common.errors import SnapshotError, SnapshotMismatch
from common.files import run_files as RF
from common.files import run_state as RS

WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
_HASH_BLOCK = 8 << 20
_WRITE_BLOCK = 256 << 20  # Linux writes at most ~2 GiB per call
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True, slots=True)
class Manifest:
    version: int
    step: int
    hash: str
    num_bytes: int
    dtype: str
    created_unix: float
    writer: str = ""  # host_id() of the writing process; "" = unknown (never trusted)
    base_hash: str = ""  # an adapter's base (common/weights/adapter.py); "" = a whole model


def snapshot_dir(root: Path, version: int) -> Path:
    return root / f"v{version:06d}"


def hash_bytes(data: bytes | memoryview) -> str:
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()


def hash_file(path: Path) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            hasher.update(block)
    return hasher.hexdigest()


def write_file(path: Path, data: memoryview | list[memoryview], *, fsync: bool = True) -> str:
    """Write `data` (one buffer, or parts written one after another) to a new file `path`
    (fsynced when `fsync`); return its BLAKE3 hex digest.

    No byte is copied in user space. With fsync the hash runs on a second thread over the same
    memory while this one waits in `fsync` (idle CPU), so the cost is about write +
    max(fsync, hash). Hashing during the write instead makes both compete for the cores:
    measured on 2 busy cores, 257 MB: 1.04x a raw write+fsync this way, 1.39x concurrently.
    Without fsync there is no wait to hide it in: the hash runs here, after the write (no
    thread started per file). The file must not exist yet; its descriptor is closed whatever
    happens."""
    parts = data if isinstance(data, list) else [data]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for part in parts:
            done = 0
            while done < len(part):
                done += os.write(fd, part[done : done + _WRITE_BLOCK])
        if not fsync:
            return hash_parts(parts)
        with ThreadPoolExecutor(1, thread_name_prefix="blake3") as pool:
            digest = pool.submit(hash_parts, parts)
            os.fsync(fd)
            return digest.result()
    finally:
        os.close(fd)


def hash_parts(parts: list[memoryview]) -> str:
    """BLAKE3 of the parts' bytes one after another (one part: `hash_bytes`)."""
    if len(parts) == 1:
        return hash_bytes(parts[0])
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for part in parts:
        hasher.update(part)
    return hasher.hexdigest()


def host_id() -> str:
    """`hostname/boot id`: equal for two processes only when they share a kernel (one page
    cache) since its last boot; "" where the boot id is unknown (then nothing is trusted)."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        return ""
    return f"{socket.gethostname()}/{boot}" if boot else ""


def written_here(manifest: Manifest) -> bool:
    """True when `manifest` was written by a process on this host since its last boot."""
    return bool(manifest.writer) and manifest.writer == host_id()


def verify_bytes(data: bytes | memoryview, *, expected_hash: str, expected_bytes: int) -> None:
    if len(data) != expected_bytes:
        raise SnapshotError(f"snapshot has {len(data)} bytes, manifest says {expected_bytes}")
    got = hash_bytes(data)
    if got != expected_hash:
        raise SnapshotError(f"snapshot hash {got[:12]}… != manifest {expected_hash[:12]}…")


def verify_file(path: Path, *, expected_hash: str, expected_bytes: int) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    if size != expected_bytes:
        raise SnapshotError(f"{path} has {size} bytes, manifest says {expected_bytes}")
    got = hash_file(path)
    if got != expected_hash:
        raise SnapshotError(f"{path}: hash {got[:12]}… != manifest {expected_hash[:12]}…")


def pin_local(
    path: Path, into: Path, *, expected_hash: str, expected_bytes: int, trust_writer: bool
) -> tuple[Path, bool]:
    """`into/model.safetensors` holding the verified bytes of the snapshot file `path` (see the
    module doc), and whether the writer's manifest was trusted instead of hashing (with
    `trust_writer`: a manifest, read from the file's own directory descriptor, that was
    `written_here` with the announced hash and size). `SnapshotError` if the file disagrees
    with the announcement (nothing is left in `into`)."""
    target = into / WEIGHTS_FILE
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    try:
        fd = os.open(path.name, os.O_RDONLY, dir_fd=dir_fd)
    except OSError as exc:
        os.close(dir_fd)
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    try:
        size = os.fstat(fd).st_size
        if size != expected_bytes:
            raise SnapshotError(f"{path} has {size} bytes, manifest says {expected_bytes}")
        trusted = trust_writer and _vouched(dir_fd, expected_hash, expected_bytes)
        into.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        if _link_same_file(fd, path, target):  # the open inode, under a name of ours
            got = expected_hash if trusted else _hash_fd(fd)
        else:  # another filesystem: a copy, hashed as it is written
            got = _copy_hashing(fd, target)
        if got != expected_hash:
            raise SnapshotError(f"{path}: hash {got[:12]}… != manifest {expected_hash[:12]}…")
        return target, trusted
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
        os.close(dir_fd)


def _link_same_file(fd: int, path: Path, target: Path) -> bool:
    """Hard-link `path` as `target` if it is still the file open at `fd` (same device and
    inode: not replaced since it was opened); False if it cannot be linked (another
    filesystem) or was replaced meanwhile (then nothing is linked)."""
    try:
        os.link(path, target)
    except OSError:
        return False
    opened, linked = os.fstat(fd), os.stat(target)
    if (opened.st_dev, opened.st_ino) == (linked.st_dev, linked.st_ino):
        return True
    target.unlink()
    return False


def _vouched(dir_fd: int, expected_hash: str, expected_bytes: int) -> bool:
    """The manifest next to the file (same directory descriptor) was written on this host and
    boot and names the announced hash and size."""
    try:
        fd = os.open(MANIFEST_FILE, os.O_RDONLY, dir_fd=dir_fd)
        with open(fd, "rb") as f:
            manifest = Manifest(**json.loads(f.read(1 << 16)))
    except (OSError, ValueError, TypeError):
        return False
    return (
        written_here(manifest)
        and manifest.hash == expected_hash
        and manifest.num_bytes == expected_bytes
    )


def _hash_fd(fd: int) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    offset = 0
    while block := os.pread(fd, _HASH_BLOCK, offset):
        hasher.update(block)
        offset += len(block)
    return hasher.hexdigest()


def _copy_hashing(fd: int, target: Path) -> str:
    """Copy the file open at `fd` to `target`, hashing exactly the bytes written."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    offset = 0
    with open(target, "xb") as out:
        while block := os.pread(fd, _HASH_BLOCK, offset):
            out.write(block)
            hasher.update(block)
            offset += len(block)
    return hasher.hexdigest()


class IncomingFile:
    """A snapshot file arriving in chunks (any order), written and hashed as they come.

    Each chunk is written at its offset at once (`write` may run on other threads, beside the
    hashing: a lock keeps every write before `close`); the hash follows the contiguous prefix
    (a chunk that arrives early waits in memory until the gap before it is filled), so when
    the last byte is in, the file is already verified: no second pass, no whole-file buffer.
    `finish` raises SnapshotError (and removes the file) unless size and hash match."""

    def __init__(self, path: Path, *, expected_hash: str, expected_bytes: int) -> None:
        self.path, self.expected_hash, self.expected_bytes = path, expected_hash, expected_bytes
        # one thread: the writes run beside it, and on a few busy cores BLAKE3's own threads
        # for 1-4 MiB updates cost more than they save (measured: 3-4x slower per byte)
        self._hasher = blake3.blake3()
        self._early: dict[int, bytes | memoryview] = {}
        self.hashed = 0  # bytes of the contiguous prefix, written and hashed
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._lock = threading.Lock()

    def add(self, offset: int, data: bytes | memoryview) -> None:
        """Write `data` at `offset` and hash what became contiguous (`write` + `follow`)."""
        self.write(offset, data)
        self.follow(offset, data)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write `data` at `offset` only (one `pwrite`: safe from several threads at once, for
        chunks that do not overlap); `follow` must then be given the same chunk."""
        if not data or offset < self.hashed or offset + len(data) > self.expected_bytes:
            raise SnapshotError(
                f"chunk [{offset}, {offset + len(data)}) does not fit a snapshot of "
                f"{self.expected_bytes} bytes ({self.hashed} received)"
            )
        with self._lock:  # never a write to a closed (maybe reused) descriptor
            if self._fd < 0:
                raise SnapshotError(f"{self.path}: written after it was closed")
            os.pwrite(self._fd, data, offset)

    def follow(self, offset: int, data: bytes | memoryview) -> None:
        """Hash the chunk written at `offset` once every byte before it is hashed (one caller
        at a time); a chunk that came early waits in memory until then."""
        if offset < self.hashed or offset in self._early:
            raise SnapshotError(f"chunk at {offset} given twice")
        self._early[offset] = data
        while (ready := self._early.pop(self.hashed, None)) is not None:
            self._hasher.update(ready)
            self.hashed += len(ready)

    def finish(self) -> Path:
        """Close; the verified file's path (SnapshotError, file removed, if it disagrees)."""
        self.close()
        got = self._hasher.hexdigest()
        if self.hashed != self.expected_bytes or got != self.expected_hash:
            self.path.unlink(missing_ok=True)
            raise SnapshotError(
                f"received snapshot: {self.hashed} bytes, hash {got[:12]}… != announced "
                f"{self.expected_bytes} bytes, {self.expected_hash[:12]}…"
            )
        return self.path

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_manifest(directory: Path) -> Manifest:
    try:
        data = json.loads((directory / MANIFEST_FILE).read_text())
        return Manifest(**data)
    except (OSError, ValueError, TypeError) as exc:
        raise SnapshotError(f"{directory}: unreadable manifest ({exc})") from None


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(directory: Path) -> None:
    """fsync every file in `directory`, then the directory itself (its entries)."""
    for child in directory.iterdir():
        fsync_path(child)
    fsync_path(directory)


def finalize(tmp_dir: Path, final_dir: Path, manifest: Manifest, *, fsync: bool = True) -> None:
    """Write the manifest into `tmp_dir`, fsync everything (every file, the directory), rename
    to `final_dir` atomically, fsync the parent. `fsync=False`: the same without the fsyncs
    (the caller syncs later, or never)."""
    (tmp_dir / MANIFEST_FILE).write_text(json.dumps(asdict(manifest), indent=1))
    if fsync:
        sync_dir(tmp_dir)
    if final_dir.exists():
        shutil.rmtree(final_dir)
    os.replace(tmp_dir, final_dir)
    if fsync:
        fsync_path(final_dir.parent)


def list_versions(root: Path) -> list[int]:
    """Versions of the complete snapshots under `root`, ascending."""
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        name = child.name
        if name.startswith("v") and name[1:].isdigit() and (child / MANIFEST_FILE).exists():
            out.append(int(name[1:]))
    return sorted(out)


def prune(root: Path, keep_last: int, *, protect: tuple[int, ...] = ()) -> list[int]:
    """Delete all but the newest `keep_last` snapshots (and `protect`); returns the removed."""
    versions = list_versions(root)
    removed = [v for v in versions[: max(len(versions) - keep_last, 0)] if v not in protect]
    for v in removed:
        shutil.rmtree(snapshot_dir(root, v), ignore_errors=True)
    for stale in root.glob("*.tmp-*"):  # nothing when root does not exist
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def remove_newer(root: Path, version: int) -> list[int]:
    """Delete the snapshots above `version` (and leftover temporaries); returns the removed.

    Each leaves the timeline at once, by a rename to a temporary name, before its files are
    deleted: a file that cannot be deleted now stays under that name (the next `prune` or
    resume tries again), never under a version number the new timeline will publish."""
    removed = [v for v in list_versions(root) if v > version]
    for v in removed:
        final = snapshot_dir(root, v)
        os.replace(final, final.with_name(f"{final.name}.tmp-removed-{time.time_ns()}"))
    for stale in root.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def write_final(run_dir: Path, version: int, *, ended: str = "steps", reason: str = "") -> None:
    """Record, durably, that the run ended with snapshot `version`, and how (`RS.ENDINGS`;
    `reason` when it stopped early)."""
    assert ended in RS.ENDINGS, ended
    path = run_dir / RF.FINAL
    tmp = path.with_name(RF.FINAL + ".tmp")
    record = RS.Final(
        version=version,
        snapshot=str(snapshot_dir(Path(RF.SNAPSHOTS), version)),
        ended=ended,
        reason=reason,
    )
    with open(tmp, "w") as f:
        f.write(json.dumps(record.to_json()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(run_dir)


def final_version(run_dir: Path) -> int | None:
    """The version a run ended with (`write_final`), or None if it has not ended cleanly."""
    final = RS.read_final(run_dir)
    return None if final is None else final.version


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the header of a safetensors file, or of every `*.safetensors`
    in a directory (sharded checkpoints; none, or no directory, gives {}); `SnapshotError` for
    an unreadable file."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118
        except (OSError, SafetensorError) as exc:
            raise SnapshotError(f"cannot read safetensors header of {file}: {exc}") from None
    return shapes


def check_fits(
    file_shapes: Mapping[str, tuple[int, ...]],
    model_shapes: Mapping[str, tuple[int, ...]],
    where: Path | str,
    *,
    storage: Mapping[str, Hashable] | None = None,
    optional: Collection[str] = (),
) -> None:
    """`SnapshotError` unless the file's tensors fit the model's (the rule: module docstring).

    `storage` maps a model name to its storage (e.g. the data pointer): a name missing from the
    file is fine when another name with the same storage is there. `optional` names may be
    absent on either side (vLLM ignores a tied `lm_head.weight`; the base checkpoint may lack it).
    """
    storage = storage or {}
    present = {storage[k] for k in file_shapes if k in storage}
    missing = [
        k
        for k in model_shapes
        if k not in file_shapes
        and k not in optional
        and (k not in storage or storage[k] not in present)
    ]
    unexpected = [k for k in file_shapes if k not in model_shapes and k not in optional]
    wrong = [
        f"{k} {list(file_shapes[k])} != {list(model_shapes[k])}"
        for k in file_shapes
        if k in model_shapes and tuple(file_shapes[k]) != tuple(model_shapes[k])
    ]
    found = {"missing": sorted(missing), "unexpected": sorted(unexpected), "wrong shape": wrong}
    problems = [
        f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
        for label, keys in found.items()
        if keys
    ]
    if not file_shapes:
        problems.insert(0, "no tensors (no *.safetensors file, or an empty one)")
    if problems:
        raise SnapshotMismatch(f"snapshot {where} does not fit the model ({'; '.join(problems)})")
