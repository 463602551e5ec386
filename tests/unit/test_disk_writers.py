"""Each consumer writer on a failing disk (common/files/disk.py): ENOSPC from a real full tmpfs
(tests/small_disk.py, root only), EIO from a shim that makes one module's `open` fail. What
only reports loses the line and counts it; what a resume needs raises an OSError naming its
file and leaves what was there before whole."""

from __future__ import annotations

import errno
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from small_disk import fill, free_up, small_disk

from common.files import disk
from common.files import metrics as M
from common.files import run_files as RF
from common.files.disk import disk_fault, from_library, stop_line, writing
from consumer.server.book_writer import BookChanges, BookWriter
from consumer.stream import segments as S
from consumer.train import checkpoint


class _Failing(io.StringIO):
    """A file whose writes fail with `code` once it holds `after` characters."""

    def __init__(self, code: int, after: int) -> None:
        super().__init__()
        self.code, self.after = code, after

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.after:
            raise OSError(self.code, "injected")
        return super().write(text)


def failing_open(code: int, *, fail_from_call: int) -> Any:
    """An `open` whose `fail_from_call`-th and later calls return a failing file."""
    calls = {"n": 0}

    def fake(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if ("a" in mode or "w" in mode) and calls["n"] >= fail_from_call:
            return _Failing(code, 0)
        return open(path, mode, *args, **kwargs)

    return fake


def test_writing_names_the_file_and_disk_fault_finds_it_behind_other_errors():
    with pytest.raises(OSError, match=r"/run/x\.jsonl") as info, writing("/run/x.jsonl"):
        raise OSError(errno.ENOSPC, "No space left on device")
    wrapped = RuntimeError("the network thread failed")
    wrapped.__cause__ = info.value
    assert disk_fault(wrapped) is info.value
    assert disk_fault(ValueError("x")) is None
    assert disk_fault(OSError(errno.ENOENT, "missing")) is None  # not the disk's fault
    line = stop_line(info.value)
    assert "/run/x.jsonl" in line
    assert "ENOSPC" in line
    assert "--resume" in line


def test_a_librarys_write_error_is_told_by_its_os_error():
    fault = from_library(Exception("I/O error: Input/output error (os error 5)"), Path("/x/m"))
    assert fault is not None
    assert (fault.errno, fault.filename) == (errno.EIO, "/x/m")
    assert from_library(ValueError("bad dtype"), Path("/tmp/m")) is None


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_metrics_line_that_cannot_be_written_is_lost_and_counted(tmp_path, monkeypatch, code):
    path = tmp_path / "metrics.jsonl"
    writer = M.JsonlWriter(path)
    assert writer.write({"step": 1})
    writer.close()
    writer._file = _Failing(code, 0)  # the disk fails under the open file
    assert not writer.write({"step": 2})
    monkeypatch.setattr(M, "open", failing_open(code, fail_from_call=1), raising=False)
    assert not writer.write({"step": 3})  # still failing: reopened, and lost again
    monkeypatch.undo()
    assert writer.write({"step": 4})  # the disk is back
    writer.close()
    assert writer.lost == 2
    assert [r["step"] for r in M.read_jsonl(path)] == [1, 4]


def test_a_full_disk_loses_metrics_lines_but_never_tears_the_next_one(tmp_path):
    with small_disk(tmp_path / "disk", 1) as disk:
        writer = M.JsonlWriter(disk / "metrics.jsonl")
        assert writer.write({"step": 1})
        fill(disk)
        assert not writer.write({"step": 2, "pad": "x" * 8000})  # past its page
        free_up(disk)
        assert writer.write({"step": 3})
        writer.close()
        assert [r["step"] for r in M.read_jsonl(disk / "metrics.jsonl")] == [1, 3]
        assert writer.lost == 1


LINE = RF.LeaseLine(
    lease_id=1,
    prompt_index=2,
    step=0,
    min_version=0,
    producer_id="p",
    state="trained",
    issued_at=0.0,
)


def test_leases_and_ledger_writes_that_fail_name_their_file_and_keep_the_old_ledger(tmp_path):
    RF.write_ledger(tmp_path, RF.Ledger(balance=RF.Balance(issued=1, trained=1)))
    before = (tmp_path / RF.LEDGER).read_text()
    with small_disk(tmp_path / "disk", 1) as disk:
        (disk / RF.LEDGER).write_text(before)
        fill(disk)
        with pytest.raises(OSError, match=RF.LEASES) as info:
            RF.append_leases(disk, [LINE] * 50)
        assert info.value.errno == errno.ENOSPC
        with pytest.raises(OSError, match=RF.LEDGER):
            RF.write_ledger(disk, RF.Ledger(balance=RF.Balance(issued=2, trained=2)))
        assert (disk / RF.LEDGER).read_text() == before  # the old one, whole


def test_after_a_failed_append_the_books_writer_writes_nothing_more(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "open", failing_open(errno.EIO, fail_from_call=1), raising=False)
    writer = BookWriter(tmp_path)
    first = writer.submit(BookChanges({}, None, None, (LINE,)))
    later = writer.submit(BookChanges({}, None, None, (LINE,)))
    with pytest.raises(OSError, match=RF.LEASES):
        first.result(10)
    with pytest.raises(OSError, match=RF.LEASES):
        later.result(10)  # failed unwritten: nothing out of order after a failed write
    writer.close()
    assert isinstance(writer.error, OSError)
    assert writer.error.errno == errno.EIO
    assert not (tmp_path / RF.LEASES).exists()


def test_a_stream_segment_that_cannot_be_written_names_itself(tmp_path):
    with small_disk(tmp_path / "disk", 1) as disk:
        writer = S.SegmentWriter(disk / "stream", schema=7)
        writer.append(1, b"x" * 100)
        writer.flush()
        fill(disk)
        with pytest.raises(OSError, match="stream/") as info:
            _append_until_it_fails(writer)
        assert disk_fault(info.value) is not None
        free_up(disk)
        writer.close()


def _append_until_it_fails(writer: S.SegmentWriter) -> None:
    for _ in range(100):
        writer.append(1, b"y" * 65536)
        writer.flush()


class _Trainer:
    """Writes a checkpoint's weights through the real writers (safetensors, torch.save)."""

    def __init__(self, numel: int) -> None:
        self.model = torch.nn.Linear(numel, 1, bias=False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)

    def save_checkpoint(self, directory: Path, *, weights: object = None) -> None:
        checkpoint.save_plain(directory, self.model, self.optimizer, self.scheduler)


def test_a_checkpoint_on_a_full_disk_raises_naming_its_file_and_the_last_one_stays(tmp_path):
    book = RF.BookState(book={}, identities={}, log_sizes={})
    with small_disk(tmp_path / "disk", 2) as run_dir:
        first = checkpoint.save(run_dir, trainer=_Trainer(1000), version=1, book_state=book)
        with pytest.raises(OSError, match=r"model\.safetensors|trainer\.pt") as info:
            checkpoint.save(run_dir, trainer=_Trainer(1 << 20), version=2, book_state=book)
        assert info.value.errno == errno.ENOSPC
        assert checkpoint.current(run_dir) == first
        assert json.loads((first / "state.json").read_text())["version"] == 1
        leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if ".tmp-" in p.name]
        assert leftovers == []  # the failed one's space given back
