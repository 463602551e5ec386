"""Weight publication on real files: the format loaders expect, a copy taken at submit, a slow
writer superseded instead of waited for, rotation, errors, the fsync policy."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load, load_file, save

from common import config as C
from common import wire
from common.weights import snapshot as snap
from common.wire import SnapshotInfo
from consumer.snapshots.publisher import Publisher
from consumer.snapshots.weights_buffer import Fence, unique_tensors


def model_state(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return dict(model.state_dict())


def make(root: Path, base: Path | None = None, **kw) -> tuple[Publisher, list[SnapshotInfo]]:
    published: list[SnapshotInfo] = []
    kw.setdefault("keep_last", 3)
    return Publisher(root, base, on_published=published.append, **kw), published


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_file_holds_exactly_what_safetensors_save_would(tiny_model_dir, tmp_path, dtype):
    state = model_state(tiny_model_dir)
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    publisher, published = make(tmp_path / "snaps", tiny_model_dir)
    publisher.submit(state, version=1, step=1, dtype=dtype)
    publisher.close()
    (info,) = published
    reference = load(save({k: v.to(dtype) for k, v in unique_tensors(state).items()}))
    ours = load_file(info.path)
    assert "lm_head.weight" not in ours  # tied weights once, under the first name
    assert ours.keys() == reference.keys()
    for name, tensor in reference.items():
        assert ours[name].dtype == dtype
        assert torch.equal(ours[name], tensor), name
    with safe_open(info.path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    directory = Path(info.path).parent
    manifest = snap.read_manifest(directory)
    assert (manifest.version, manifest.num_bytes, manifest.hash) == (1, info.num_bytes, info.hash)
    assert manifest.dtype == str(dtype).removeprefix("torch.")
    assert snap.written_here(manifest)
    snap.verify_file(Path(info.path), expected_hash=info.hash, expected_bytes=info.num_bytes)
    assert (directory / "config.json").exists()
    assert (directory / "tokenizer.json").exists()


def test_transformers_loads_the_snapshot_directory_as_a_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    state = model_state(tiny_model_dir)
    state = {k: v + 0.5 for k, v in state.items()}  # not the base weights (ties broken: dedup
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # would not see them), re-tied
    publisher, published = make(tmp_path / "snaps", tiny_model_dir)
    publisher.submit(state, version=7, step=7, dtype=torch.float32)
    publisher.close()
    model = AutoModelForCausalLM.from_pretrained(Path(published[0].path).parent)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_the_copy_is_taken_at_submit_and_later_changes_do_not_leak_in(tmp_path, monkeypatch):
    """The optimizer may change the weights as soon as submit returns (on CPU)."""
    gate = threading.Event()
    real_write = snap.write_file

    def slow_write(path: Path, data: memoryview, *, fsync: bool = True) -> str:
        assert gate.wait(60)
        return real_write(path, data, fsync=fsync)

    monkeypatch.setattr(snap, "write_file", slow_write)
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    publisher, published = make(tmp_path / "snaps")
    publisher.submit(weights, version=1, step=1, dtype=torch.float32)
    weights["w"].mul_(-1)  # the next optimizer step
    gate.set()
    publisher.close()
    assert torch.equal(load_file(published[0].path)["w"], torch.arange(6.0).reshape(2, 3))


def test_a_slow_writer_is_superseded_never_waited_for(tmp_path, monkeypatch):
    """v1 is being written (the writer is stuck in it); v2, v3, v4 arrive: each submit returns
    (a submit that waited for the writer would never return here), v2 and v3 are superseded
    and never exist on disk, v4 is written next."""
    gate = threading.Event()
    real_write = snap.write_file
    started = threading.Event()

    def stuck_write(path: Path, data: memoryview, *, fsync: bool = True) -> str:
        started.set()
        assert gate.wait(60)
        return real_write(path, data, fsync=fsync)

    monkeypatch.setattr(snap, "write_file", stuck_write)
    publisher, published = make(tmp_path / "snaps", keep_last=10)
    w = torch.zeros(4)
    publisher.submit({"w": w}, version=1, step=1, dtype=torch.float32)
    assert started.wait(60)
    submitted = threading.Event()

    def train_on() -> None:
        for v in (2, 3, 4):
            w.fill_(v)
            publisher.submit({"w": w}, version=v, step=v, dtype=torch.float32)
        submitted.set()

    thread = threading.Thread(target=train_on)
    thread.start()
    assert submitted.wait(60), "a submit waited for the writer"
    assert publisher.num_superseded == 2
    gate.set()
    publisher.close()
    thread.join()
    assert [p.version for p in published] == [1, 4]
    assert snap.list_versions(tmp_path / "snaps") == [1, 4]
    assert torch.equal(load_file(published[1].path)["w"], torch.full((4,), 4.0))
    assert publisher.num_buffers == 2  # the second one for the copy the stuck writer held up


def test_a_writer_that_keeps_up_with_the_steps_costs_one_host_buffer(tmp_path):
    publisher, published = make(tmp_path / "snaps", keep_last=10)
    w = torch.zeros(4)
    for v in range(1, 6):
        w.fill_(v)
        publisher.submit({"w": w}, version=v, step=v, dtype=torch.float32)
        publisher.wait()  # the next step comes after the write (a CPU step takes seconds)
    publisher.close()
    assert [p.version for p in published] == [1, 2, 3, 4, 5]
    assert publisher.num_buffers == 1


def test_wait_queued_lets_every_version_be_written_while_one_is_in_writing(tmp_path, monkeypatch):
    """A replay publishes every version: wait_queued returns once the version before is taken
    by the writer, which is still stuck in writing it, so a submit after each wait_queued
    supersedes nothing, never waits for a write, and v1..v4 all reach the disk."""
    gates = [threading.Event() for _ in range(4)]
    started = [threading.Event() for _ in range(4)]
    calls: list[int] = []
    real_write = snap.write_file

    def gated_write(path: Path, data: memoryview, *, fsync: bool = True) -> str:
        n = len(calls)  # the n-th write: version n + 1, if none is superseded
        calls.append(n)
        started[n].set()
        assert gates[n].wait(60)
        return real_write(path, data, fsync=fsync)

    monkeypatch.setattr(snap, "write_file", gated_write)
    publisher, published = make(tmp_path / "snaps", keep_last=10)
    w = torch.zeros(4)
    for v in range(1, 5):
        publisher.wait_queued()
        assert publisher.num_superseded == 0
        w.fill_(v)
        publisher.submit({"w": w}, version=v, step=v, dtype=torch.float32)
        if v == 1:
            assert started[0].wait(60)  # v1 is taken at once
        else:
            assert not gates[v - 2].is_set()  # v-1 still in writing while v was submitted
            gates[v - 2].set()
    gates[3].set()
    publisher.close()
    assert [p.version for p in published] == [1, 2, 3, 4]
    for info in published:
        assert torch.equal(load_file(info.path)["w"], torch.full((4,), float(info.version)))
    assert publisher.num_superseded == 0


def test_rotation_keeps_the_last_snapshots_and_prunes_after_the_announcement(tmp_path):
    root = tmp_path / "snaps"
    on_disk_at_announce: list[list[int]] = []

    def announce(info: SnapshotInfo) -> None:
        on_disk_at_announce.append(snap.list_versions(root))

    publisher = Publisher(root, None, keep_last=2, on_published=announce)
    for v in range(5):
        publisher.submit({"w": torch.full((3,), float(v))}, version=v, step=v, dtype=torch.float32)
        publisher.wait()
        assert snap.list_versions(root) == list(range(max(0, v - 1), v + 1))
    publisher.close()
    # the oldest goes only once the newest is announced (nobody waits for the deletion)
    assert on_disk_at_announce == [[0], [0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert sorted(p.name for p in root.iterdir()) == ["v000003", "v000004"]


def test_a_writer_error_reaches_the_training_thread(tmp_path, monkeypatch):
    def broken(path: Path, data: memoryview, *, fsync: bool = True) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(snap, "write_file", broken)
    publisher, published = make(tmp_path / "snaps")
    publisher.submit({"w": torch.zeros(2)}, version=1, step=1, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="publication failed") as info:
        publisher.wait()
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(RuntimeError, match="publication failed"):
        publisher.submit({"w": torch.zeros(2)}, version=2, step=2, dtype=torch.float32)
    assert published == []
    assert snap.list_versions(tmp_path / "snaps") == []


def test_changed_weights_are_refused_with_a_clear_error(tmp_path):
    publisher, _ = make(tmp_path / "snaps")
    publisher.submit({"w": torch.zeros(2)}, version=1, step=1, dtype=torch.float32)
    with pytest.raises(ValueError, match="no longer match"):
        publisher.submit({"w": torch.zeros(3)}, version=2, step=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="no longer match"):
        publisher.submit({"v": torch.zeros(2)}, version=2, step=2, dtype=torch.float32)
    publisher.submit({"w": torch.ones(2)}, version=2, step=2, dtype=torch.float32)
    publisher.close()


@pytest.mark.parametrize("fsync", ["before_announce", "after_announce", "off"])
def test_the_fsync_policy_decides_every_fsync_and_every_descriptor_is_closed(
    tmp_path, monkeypatch, fsync
):
    synced: list[int] = []
    opened: set[int] = set()
    real_open, real_close, real_fsync = os.open, os.close, os.fsync

    def counting_open(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        opened.add(fd)
        return fd

    def counting_close(fd: int) -> None:
        opened.discard(fd)
        real_close(fd)

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    def announce(info: SnapshotInfo) -> None:
        published.append((info, len(synced)))

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "close", counting_close)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    published: list[tuple[SnapshotInfo, int]] = []
    publisher = Publisher(tmp_path / "snaps", None, keep_last=3, on_published=announce, fsync=fsync)
    publisher.submit({"w": torch.zeros(2)}, version=1, step=1, dtype=torch.float32)
    publisher.close()
    ((_, synced_at_announce),) = published
    assert opened == set()
    # before: weights (while hashed), then every file (weights, manifest), the directory and
    # the parent; after: every file (the chunk hashes, written once announced, too), the
    # directory, the parent
    assert (synced_at_announce, len(synced)) == {
        "before_announce": (5, 5),
        "after_announce": (0, 5),
        "off": (0, 0),
    }[fsync]


def test_an_unknown_fsync_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must be one of"):
        make(tmp_path, fsync="sometimes")


class RecordingFence(Fence):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def hold_stream(self) -> None:
        self.events.append("hold")


def test_the_trainer_holds_a_pending_copy_before_its_optimizer_changes_the_weights(
    tiny_model_dir,
):
    from consumer.train.trainer import DeviceTrainer

    cfg = C.override(C.Config(), {"model.device": "cpu", "sampling.group_size": 4})
    trainer = DeviceTrainer(cfg, tiny_model_dir)
    events: list[str] = []
    trainer.optimizer.register_step_pre_hook(lambda *_: events.append("step"))
    rng = np.random.default_rng(0)
    group = wire.Group(
        lease_id=0, producer_id="t", prompt_index=0, behavior_version=0,
        prompt_ids=np.array([5, 6, 7], np.int32),
        completion_ids=rng.integers(2, trainer.vocab_size, 4 * 5).astype(np.int32),
        completion_lens=np.full(4, 5, np.int32), behavior_logp=np.full(20, -2.0, np.float32),
        token_versions=np.zeros(0, np.int32), rewards=np.array([0, 1, 0, 1], np.float32),
        finish_reasons=("length",) * 4, temperature=1.0,
    )  # fmt: skip
    trainer.hold_weights(RecordingFence(events))
    trainer.step([group])
    trainer.step([group])  # nothing pending any more: nothing to hold
    assert events == ["hold", "step", "step"]
    assert set(trainer.weights()) == set(trainer.model.state_dict())


# -- CPU weights already in the snapshot dtype: written from the weights themselves -----------
def test_live_cpu_weights_are_written_as_they_are_with_no_host_buffer(tiny_model_dir, tmp_path):
    state = model_state(tiny_model_dir)
    copied, by_copy = make(tmp_path / "copied", tiny_model_dir)
    copied.submit(state, version=1, step=1, dtype=torch.float32)
    copied.close()
    live, by_live = make(tmp_path / "live", tiny_model_dir, live_min_bytes=0)
    fence = live.submit(state, version=1, step=1, dtype=torch.float32)
    fence.hold_stream()  # returns once the writer has read them
    assert fence.done()
    live.close()
    assert live.num_buffers == 0
    assert live.buffer_bytes == 0
    assert copied.num_buffers == 1
    assert by_live[0].hash == by_copy[0].hash  # the same bytes, byte for byte
    assert by_live[0].num_bytes == by_copy[0].num_bytes
    info = by_live[0]
    snap.verify_file(Path(info.path), expected_hash=info.hash, expected_bytes=info.num_bytes)


def test_the_next_optimizer_step_waits_until_the_writer_has_read_the_live_weights(
    tmp_path, monkeypatch
):
    gate, read = threading.Event(), threading.Event()
    real_write = snap.write_file

    def slow_write(path: Path, data, *, fsync: bool = True) -> str:
        assert gate.wait(60)
        digest = real_write(path, data, fsync=fsync)
        read.set()
        return digest

    monkeypatch.setattr(snap, "write_file", slow_write)
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    publisher, published = make(tmp_path / "snaps", live_min_bytes=0)
    fence = publisher.submit(weights, version=1, step=1, dtype=torch.float32)
    assert not fence.done()  # the writer has not read them yet
    holder = threading.Thread(target=fence.hold_stream)
    holder.start()
    gate.set()
    holder.join(60)
    assert read.is_set()
    assert fence.done()
    weights["w"].mul_(-1)  # the optimizer step, after the hold
    publisher.close()
    assert torch.equal(load_file(published[0].path)["w"], torch.arange(6.0).reshape(2, 3))


def test_a_failed_live_write_lets_the_optimizer_go_on_and_reaches_the_training_thread(
    tmp_path, monkeypatch
):
    def broken(path: Path, data, *, fsync: bool = True) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(snap, "write_file", broken)
    publisher, published = make(tmp_path / "snaps", live_min_bytes=0)
    fence = publisher.submit({"w": torch.zeros(2)}, version=1, step=1, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="publication failed"):
        publisher.wait()
    fence.hold_stream()  # released: never blocks the trainer for good
    assert published == []


def test_small_or_converted_weights_still_go_through_a_host_buffer(tmp_path):
    weights = {"w": torch.zeros(4, dtype=torch.float32)}
    small, _ = make(tmp_path / "small")  # under LIVE_MIN_BYTES
    small.submit(weights, version=1, step=1, dtype=torch.float32)
    small.close()
    bf16, _ = make(tmp_path / "bf16", live_min_bytes=0)  # stored in another dtype
    bf16.submit(weights, version=1, step=1, dtype=torch.bfloat16)
    bf16.close()
    assert small.num_buffers == 1
    assert bf16.num_buffers == 1
