"""A checkpoint survives a kill at any instant of its save; resume cleans up what a kill left.

The kill is real and deterministic: a forked child saves a checkpoint and SIGKILLs itself just
before its k-th filesystem step (an fsync, rename, replace or removal), for k = 0, 1, ... until
the save completes; after each kill the parent loads the run directory and must find a complete
checkpoint, the old one or the new one, never neither (the earlier scheme left none when killed
between its two renames).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from common.errors import ConfigError
from common.files import run_files as RF
from common.wire import SnapshotInfo
from consumer.snapshots.publisher import Publisher
from consumer.train import checkpoint


class TinyTrainer:
    """The checkpointed parts of a one-device trainer (a linear layer that took one AdamW step),
    written and read by the plain format as `DeviceTrainer` does."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(4, 3)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.model(torch.ones(2, 4)).sum().backward()
        self.optimizer.step()  # moments to save
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    def save_checkpoint(self, directory: Path, *, weights: SnapshotInfo | None = None) -> None:
        checkpoint.save_plain(
            directory, self.model, self.optimizer, self.scheduler, published=weights
        )

    def load_checkpoint(self, directory: Path) -> None:
        checkpoint.load_plain(
            directory, self.model, self.optimizer, self.scheduler, device=torch.device("cpu")
        )


def make_trainer(seed: int) -> TinyTrainer:
    return TinyTrainer(seed)


def save(run_dir: Path, version: int, seed: int) -> None:
    book = RF.BookState(book={"incarnation": 0, "version_was": version})
    checkpoint.save(run_dir, trainer=make_trainer(seed), version=version, book_state=book)


def load(run_dir: Path) -> tuple[int, torch.Tensor]:
    trainer = make_trainer(99)
    version, _ = checkpoint.load(run_dir, trainer=trainer)
    return version, trainer.model.weight.detach().clone()


def save_killed_at(run_dir: Path, step: int) -> bool:
    """Save version 2 in a forked child that is SIGKILLed before its `step`-th filesystem
    step; True if it was killed (False: the save has fewer steps and completed)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            calls = [0]

            def deadly(fn):
                def wrapped(*args, **kwargs):
                    if calls[0] == step:
                        os.kill(os.getpid(), signal.SIGKILL)
                    calls[0] += 1
                    return fn(*args, **kwargs)

                return wrapped

            for mod, name in [(os, "fsync"), (os, "rename"), (os, "replace"), (shutil, "rmtree")]:
                setattr(mod, name, deadly(getattr(mod, name)))
            save(run_dir, 2, seed=2)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


def test_a_kill_at_every_step_of_a_save_leaves_the_old_or_the_new_checkpoint(tmp_path):
    old_weights = make_trainer(1).model.weight.detach().clone()
    new_weights = make_trainer(2).model.weight.detach().clone()
    seen, step = [], 0
    while True:
        run_dir = tmp_path / f"kill-{step}"
        run_dir.mkdir()
        save(run_dir, 1, seed=1)
        killed = save_killed_at(run_dir, step)
        version, weights = load(run_dir)
        assert torch.equal(weights, old_weights if version == 1 else new_weights), step
        seen.append(version)
        if not killed:
            break
        save(run_dir, 3, seed=3)  # the next save clears what the kill left behind
        names = sorted(p.name for p in (run_dir / checkpoint.ROOT).iterdir())
        assert names[0] == "LATEST"  # and one checkpoint: nothing left behind
        assert len(names) == 2
        assert names[1].startswith("v000003-")
        step += 1
    assert step >= 5  # the save has that many fsyncs and renames to be killed at
    assert seen[0] == 1  # killed before anything: the old one
    assert seen[-1] == 2  # completed: the new one
    assert seen == sorted(seen)  # the switch happens once, at one instant


def test_resume_finds_no_checkpoint_with_a_clear_error(tmp_path):
    from common.errors import ConfigError

    with pytest.raises(ConfigError, match="no checkpoint"):
        load(tmp_path)


def test_a_run_directory_of_the_former_layout_still_resumes(tmp_path):
    save(tmp_path, 4, seed=4)
    latest = checkpoint.current(tmp_path)
    assert latest is not None
    latest.rename(tmp_path / checkpoint.LEGACY_DIR)
    shutil.rmtree(tmp_path / checkpoint.ROOT)
    assert load(tmp_path)[0] == 4
    checkpoint.record_incarnation(tmp_path, 7)
    state = json.loads((tmp_path / checkpoint.LEGACY_DIR / "state.json").read_text())
    assert state["book"]["incarnation"] == 7


def published(trainer: TinyTrainer, root: Path, version: int) -> SnapshotInfo:
    """The trainer's weights published as a float32 snapshot, as the learner does."""
    infos: list[SnapshotInfo] = []
    publisher = Publisher(root, None, keep_last=5, on_published=infos.append)
    state = dict(trainer.model.state_dict())
    publisher.submit(state, version=version, step=version, dtype=torch.float32)
    publisher.close()
    return infos[0]


def test_a_checkpoint_links_the_published_float32_weights_and_resumes_from_them(tmp_path):
    trainer = make_trainer(3)
    info = published(trainer, tmp_path / "snapshots", version=4)
    book = RF.BookState(book={"incarnation": 0})
    where = checkpoint.save(tmp_path, trainer=trainer, version=4, book_state=book, published=info)
    weights = where / "model.safetensors"
    assert os.path.samefile(weights, info.path)  # one file on disk, not two
    shutil.rmtree(Path(info.path).parent)  # the snapshot pruned later: the link keeps the bytes
    version, restored = load(tmp_path)
    assert version == 4
    assert torch.equal(restored, trainer.model.weight)


def test_a_linked_weights_file_that_changed_is_refused_at_resume(tmp_path):
    trainer = make_trainer(3)
    info = published(trainer, tmp_path / "snapshots", version=4)
    book = RF.BookState(book={"incarnation": 0})
    where = checkpoint.save(tmp_path, trainer=trainer, version=4, book_state=book, published=info)
    with open(where / "model.safetensors", "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(ConfigError, match=r"run.resume: the checkpoint's weights changed"):
        load(tmp_path)


def test_weights_are_written_where_the_snapshot_cannot_be_linked(tmp_path, monkeypatch):
    trainer = make_trainer(3)
    info = published(trainer, tmp_path / "snapshots", version=4)

    def no_link(*_: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    book = RF.BookState(book={"incarnation": 0})
    where = checkpoint.save(tmp_path, trainer=trainer, version=4, book_state=book, published=info)
    assert not os.path.samefile(where / "model.safetensors", info.path)
    monkeypatch.undo()
    _, restored = load(tmp_path)
    assert torch.equal(restored, trainer.model.weight)
